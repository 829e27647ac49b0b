"""Sizes as the allocator's rules need them written: exact near MiB and GiB boundaries."""
import pytest

from experiments.core.units import GiB, KiB, MiB, format_bytes, mib, mib_figure, number


@pytest.mark.parametrize("nbytes, text", [
    (16 * MiB, "16 MiB"), (MiB + MiB // 2, "1.5 MiB"), (100 * KiB, "100 KiB"), (1000, "1000 B"),
    # the small-pool limit and the 2 MiB segment: one byte either side must stay visible
    (MiB + 1, "1 MiB + 1 B"), (2 * MiB - 512, "2 MiB − 512 B"), (20 * MiB, "20 MiB"),
    (100 * GiB - 10 * MiB, "99.99 GiB"), (103_420 * MiB, "101 GiB"), (-2 * MiB, "−2 MiB"), (0, "0 B"),
])
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


def test_format_bytes_digits_and_bad_digits():
    assert format_bytes(1.902 * MiB, digits=3) == "1.9 MiB"
    assert format_bytes(1.902 * MiB) == "1.902 MiB"
    with pytest.raises(ValueError, match="digits must be >= 1"):
        format_bytes(MiB, digits=0)


def test_mib_and_numbers():
    assert mib(3 * MiB) == 3.0 and mib_figure(64 * MiB) == 64 and isinstance(mib_figure(64 * MiB), int)
    assert mib_figure(1.25 * MiB) == 1.2 or mib_figure(1.25 * MiB) == 1.3
    assert [number(x) for x in (1024, 536870912.0, 0.5, 20.0)] == ["1024", "536,870,912", "0.5", "20"]
