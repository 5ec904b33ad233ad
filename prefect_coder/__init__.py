"""The ``prefect-coder`` command."""
