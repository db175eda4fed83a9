"""coec.io.isolated: one call in a spawned child; its result or its exception comes back, and a
child killed by a signal raises ProcessCrashed naming the signal instead of killing the caller."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from coec.io.isolated import ProcessCrashed, call_isolated, describe_exit, signal_name


def _add(a, b, scale=1):
    return (a + b) * scale


def _raise(msg):
    raise ValueError(msg)


def _die(sig):
    os.kill(os.getpid(), sig)


def _exit(code):
    os._exit(code)


def _big(n):
    return np.arange(n, dtype=np.float32)


def test_signal_names_and_descriptions():
    assert signal_name(-11) == "SIGSEGV" and signal_name(139) == "SIGSEGV"
    assert signal_name(-6) == "SIGABRT" and signal_name(134) == "SIGABRT"
    assert signal_name(0) is None and signal_name(1) is None and signal_name(None) is None
    assert describe_exit(-11) == "SIGSEGV (signal 11)"
    assert describe_exit(139) == "SIGSEGV (signal 11)"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None) == "no exit code"


def test_result_and_keyword_arguments_come_back():
    assert call_isolated(_add, 2, 3, scale=4) == 20


def test_a_large_result_comes_back_whole():
    """More than a pipe's buffer: the parent reads before it joins."""
    out = call_isolated(_big, 3_000_000)
    assert out.shape == (3_000_000,) and out[-1] == 2_999_999


def test_the_childs_exception_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="bad input"):
        call_isolated(_raise, "bad input")


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_a_child_killed_by_a_signal_raises_one_line(sig):
    with pytest.raises(ProcessCrashed) as err:
        call_isolated(_die, sig, what="llama.cpp on x.gguf")
    name = signal.Signals(sig).name
    assert str(err.value) == f"llama.cpp on x.gguf died with {name} (signal {int(sig)})"
    assert err.value.signal == name and err.value.exitcode == -int(sig)


def test_a_child_that_exits_without_a_result_raises():
    with pytest.raises(ProcessCrashed, match=r"_exit died with exit code 7") as err:
        call_isolated(_exit, 7)
    assert err.value.signal is None
