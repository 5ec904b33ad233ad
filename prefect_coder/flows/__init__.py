"""Prefect flows: they sequence tasks and decide; the durable work happens in tasks."""
