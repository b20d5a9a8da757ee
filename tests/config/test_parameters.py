"""Reading a config's integer parameters: one reader for every backend and the scheduling policy."""

from __future__ import annotations

import pytest

from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import ConfigError, parse_config

CONFIG = """
name: "m"
parameters { key: "Intra_Op_Thread_Count" value: { string_value: "3" } }
parameters { key: "request_split_size" value: { string_value: "0" } }
"""


def test_the_first_spelling_present_wins_and_zero_is_a_value() -> None:
    parameters = {"intra_op_num_threads": "2", "intra_op_thread_count": "4", "request_split_size": "0"}
    assert natural_parameter(parameters, ("intra_op_thread_count", "intra_op_num_threads"), 1) == 4
    assert natural_parameter(parameters, ("request_split_size",), 7) == 0
    assert natural_parameter(parameters, ("absent",), None) is None


@pytest.mark.parametrize("text", ["-1", "many", "1.5", ""])
def test_anything_but_a_natural_number_names_the_parameter(text: str) -> None:
    with pytest.raises(ConfigError, match=f"parameter TF_NUM_INTRA_THREADS must be an integer >= 0, got '{text}'"):
        natural_parameter({"TF_NUM_INTRA_THREADS": text}, ("TF_NUM_INTRA_THREADS",), None)


def test_string_parameters_of_a_config() -> None:
    config = parse_config(CONFIG)
    assert string_parameters(config) == {"Intra_Op_Thread_Count": "3", "request_split_size": "0"}
    assert string_parameters(config, lower=True)["intra_op_thread_count"] == "3"
