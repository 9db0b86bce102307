"""speedtorch.transfer_config / set_transfer_config: the option names come from the C++ table
(csrc/transfer/transfer_policy.h, for_each_transfer_option), so Python lists none of its own."""

from __future__ import annotations

import pytest
import torch

import speedtorch


def test_names_come_from_the_library():
    names = list(torch.ops.speedtorch.transfer_option_names())
    assert len(names) == len(set(names)) and "uva_fraction" in names and "staged_max_gbps" in names
    assert list(speedtorch.transfer_config()) == names


def test_every_named_option_round_trips():
    for name, value in speedtorch.transfer_config().items():
        speedtorch.set_transfer_config(**{name: value})
        assert speedtorch.transfer_config()[name] == value


def test_unknown_option_lists_the_known_ones():
    message = "unknown option 'no_such_option'; known options: uva_fraction, .*, staged_max_gbps"
    with pytest.raises(RuntimeError, match=message):
        speedtorch.set_transfer_config(no_such_option=1)
