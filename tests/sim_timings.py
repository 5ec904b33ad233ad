"""The simulator's timings for tests: every window of the real server shrunk to milliseconds."""

from __future__ import annotations

from coder_chat.simulator import SimulatorConfig


def fast_config(**overrides: object) -> SimulatorConfig:
    """Timings shrunk so every window of the real server takes milliseconds."""
    config = SimulatorConfig(
        tool_result_deadline=5.0,
        interrupt_winddown=0.05,
        delta_interval=0.0,
        step_delay=0.0,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config
