import pytest

from pgoutput_spark import Lsn


@pytest.mark.parametrize("text, value", [("0/0", 0), ("0/16B3748", 0x16B3748),
                                         ("FFFFFFFF/FFFFFFFF", 2**64 - 1), ("1/0", 2**32)])
def test_round_trip(text, value):
    assert Lsn(text) == value
    assert str(Lsn(value)) == text
    assert repr(Lsn(value)) == f"Lsn('{text}')"


@pytest.mark.parametrize("bad", ["", "16B3748", "0/G", "1/2/3", -1, 2**64])
def test_rejects(bad):
    with pytest.raises(ValueError):
        Lsn(bad)
