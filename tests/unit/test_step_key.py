"""``step_key``: the name a step's persisted result is stored under."""

from __future__ import annotations

from prefect_coder.tasks.turns import step_key

#: Linux refuses a file name longer than this many bytes.
NAME_MAX = 255


def test_a_key_is_one_readable_ascii_file_name() -> None:
    key = step_key("tenant-1", "Trip/7/../x", 2, "plan it")
    assert key.startswith("prefect-coder-trip-7----x-step-2-"), key
    assert key.isascii() and "/" not in key


def test_a_key_fits_a_file_name_whatever_the_workflow_id_holds() -> None:
    for workflow_id in ("\U00020000" * 60, "ü" * 500, "x" * 5000):
        key = step_key("tenant-1", workflow_id, 1, "p")
        assert key.isascii() and len(key.encode()) < NAME_MAX, key


def test_keys_differ_in_every_id_even_where_their_names_read_alike() -> None:
    base = ("tenant-1", "trip-7", 1, "plan it")
    keys = {
        step_key(*base),
        step_key("tenant-2", "trip-7", 1, "plan it"),
        step_key("tenant-1", "trip/7", 1, "plan it"),  # reads as trip-7 too
        step_key("tenant-1", "trip-7", 2, "plan it"),
        step_key("tenant-1", "trip-7", 1, "plan it again"),
        step_key("tenant-1", "trip-7\0", 1, "plan it"),
    }
    assert len(keys) == 6
    assert step_key(*base) == step_key(*base)
