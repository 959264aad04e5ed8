"""An external command's error carries the end of what the command wrote
(runtime.errors.note_command_output): a user audit (parslmig, 5) found a task's
``CalledProcessError`` recorded as ``Command '[...]' returned non-zero exit status 3.``
alone, the tool's stderr (why it failed) in the client's exception object only. A real
run's client, dashboard and monitoring database: tests/test_monitordb_failures.py."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from actors.scheduler_records import MAX_ERROR_CHARS, error_record, error_text
from runtime.errors import (
    MAX_COMMAND_OUTPUT,
    MERGED_NOT_CAPTURED_NOTE,
    NOT_CAPTURED_NOTE,
    TaskErrorTooLarge,
    note_command_output,
)
from runtime.remote import bound_error


def _failed(stderr: object = None, output: object = None) -> subprocess.CalledProcessError:
    return subprocess.CalledProcessError(3, ["wcs", "ccd3.fits"], output=output, stderr=stderr)


def test_the_end_of_a_failed_command_s_stderr_is_a_note_and_ends_its_text() -> None:
    err = _failed(stderr="reading ccd3.fits\nERROR: bad WCS header in ccd3.fits\n\n")
    note_command_output(err)
    note_command_output(err)  # once per exception
    note = "the command's stderr:\nreading ccd3.fits\nERROR: bad WCS header in ccd3.fits"
    assert err.__notes__ == [note]
    assert error_text(err) == (
        "Command '['wcs', 'ccd3.fits']' returned non-zero exit status 3.\n" + note
    )
    assert error_record(err).summary == f"CalledProcessError: {error_text(err)}"


def test_bytes_are_decoded_and_only_the_last_2000_characters_are_kept() -> None:
    """Bytes that do not decode are replaced; of a long stderr its end is kept, saying
    so; with no stderr (``stderr=STDOUT``), its output."""
    err = _failed(stderr=b"x" * 10_000 + b"\xff\nERROR: disk quota\n")
    note_command_output(err)
    tail = ("x" * 10_000 + "\ufffd\nERROR: disk quota")[-MAX_COMMAND_OUTPUT:]
    assert err.__notes__ == [f"the command's stderr (its last 2000 characters):\n{tail}"]
    merged = _failed(stderr=b"", output=b"step 1\nfailed: no input\n")
    note_command_output(merged)
    assert merged.__notes__ == ["the command's output:\nstep 1\nfailed: no input"]
    timeout = subprocess.TimeoutExpired(["wcs"], 5.0, output=None, stderr=b"still reading\n")
    note_command_output(timeout)
    assert timeout.__notes__ == ["the command's stderr:\nstill reading"]


def test_an_error_without_a_command_s_output_is_left_as_it_is() -> None:
    """A command whose output was captured and is blank, and any other error, get no
    note (one whose output was not captured at all: the test below)."""
    other = ValueError("bad row")
    for err in (other, _failed(stderr="   \n"), _failed(stderr=b"", output=b"")):
        note_command_output(err)
        assert not hasattr(err, "__notes__")
    assert error_text(other) == "bad row"
    long = ValueError("v" * 5_000)
    assert error_text(long) == "v" * MAX_ERROR_CHARS


def test_where_a_task_s_error_is_caught_it_gets_the_note_and_it_travels() -> None:
    """bound_error (called where a task's exception is caught, in its thread or task
    process) notes every command error of its chain; the note pickles with it, to the
    worker and the client; a command error too large to travel keeps it in the text of
    the TaskErrorTooLarge that stands for it."""
    inner = _failed(stderr=b"ERROR: bad WCS header\n")
    try:
        try:
            raise inner
        except subprocess.CalledProcessError as exc:
            raise RuntimeError("calibration failed") from exc
    except RuntimeError as outer:
        caught = outer
    assert bound_error(caught, "k", 1 << 20) is caught
    assert inner.__notes__ == ["the command's stderr:\nERROR: bad WCS header"]
    assert not hasattr(caught, "__notes__")
    back = pickle.loads(cloudpickle.dumps(inner))
    assert back.__notes__ == inner.__notes__ and back.stderr == inner.stderr
    chain = error_record(caught).chain
    assert chain[0][1].endswith("\nthe command's stderr:\nERROR: bad WCS header")
    huge = subprocess.CalledProcessError(3, ["wcs", "y" * 5_000], stderr=b"ERROR: no room\n")
    stand_in = bound_error(huge, "k", 1_000)
    assert isinstance(stand_in, TaskErrorTooLarge)
    assert stand_in.head.endswith("yyy\nthe command's stderr:\nERROR: no room")
    assert str(stand_in).count("ERROR: no room") == 1


def test_a_command_whose_output_was_not_captured_says_so_and_what_to_do() -> None:
    """A user audit (parsl): a bash_app converted as ``subprocess.run(cmd,
    shell=True, check=True)``, or with ``stderr=`` a file as Parsl's ``stderr=``
    redirects it, failed with ``returned non-zero exit status 4.`` alone: its stderr
    was in the manager's log, a line not naming the task, and nothing said to capture
    it. Now such an error (``stderr`` and ``output`` None) carries a note saying where
    its stderr went and how to have it with the error; the scheduler's text of it (the
    dashboard, the monitoring database) ends with it, once."""
    for err in (_failed(), subprocess.TimeoutExpired(["wcs"], 5.0)):
        note_command_output(err)
        note_command_output(err)
        assert err.__notes__ == [NOT_CAPTURED_NOTE]
        assert error_text(err) == f"{err}\n{NOT_CAPTURED_NOTE}"
    assert NOT_CAPTURED_NOTE.startswith("the command's stderr was not captured: ")
    assert "capture_output=True" in NOT_CAPTURED_NOTE
    # Its stdout captured alone (stdout=PIPE, for its result) and blank: its stderr
    # went to the worker's too. Before, it got no note (its output was not None).
    run = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(subprocess.CalledProcessError) as info:
        subprocess.run(run, stdout=subprocess.PIPE, check=True, timeout=60)
    assert (info.value.output, info.value.stderr) == (b"", None)
    note_command_output(info.value)
    assert info.value.__notes__ == [NOT_CAPTURED_NOTE]
    quiet = subprocess.SubprocessError("no command's fields")  # not a command's error
    note_command_output(quiet)
    assert not hasattr(quiet, "__notes__")


def test_a_command_whose_stderr_went_with_its_stdout_is_not_said_uncaptured() -> None:
    """An audit: ``subprocess.run(cmd, stdout=PIPE, stderr=STDOUT, check=True)`` of a
    command that wrote nothing got the note that its stderr "was not captured" and to
    run it with ``capture_output=True``: it was captured, with its stdout, and empty.
    With ``stderr=STDOUT`` and stdout not captured, the note said the stderr went to
    "the file given as stderr=": it went with the stdout. Both now say what happened
    (read from the call's own arguments, in the error's traceback); its output, when
    there is some, is the note as before."""
    silent = [sys.executable, "-c", "import sys; sys.exit(3)"]
    loud = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    merged = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "check": True}
    for call in (
        lambda: subprocess.run(silent, timeout=60, **merged),
        lambda: subprocess.check_output(silent, stderr=subprocess.STDOUT, timeout=60),
    ):
        with pytest.raises(subprocess.CalledProcessError) as info:
            call()
        assert (info.value.output, info.value.stderr) == (b"", None)
        note_command_output(info.value)
        assert info.value.__notes__ == [
            "the command's output (its stdout and stderr, stderr=subprocess.STDOUT) was "
            "empty: it wrote nothing"
        ]
    with pytest.raises(subprocess.CalledProcessError) as info:
        subprocess.run(loud, timeout=60, **merged)
    note_command_output(info.value)
    assert info.value.__notes__ == ["the command's output:\nboom"]
    with pytest.raises(subprocess.CalledProcessError) as info:  # stdout not captured
        subprocess.run(silent, stderr=subprocess.STDOUT, check=True, timeout=60)
    note_command_output(info.value)
    assert info.value.__notes__ == [
        "the command's stderr was not captured: it went with its stdout (stderr="
        "subprocess.STDOUT), which was not captured either, to the file given as "
        "stdout=, or else where the task's worker writes its stdout. To have its end "
        "here, run the command with stdout=subprocess.PIPE too: "
        "docs/configuration.md#where-a-tasks-output-goes"
    ]


def test_a_command_whose_output_went_to_a_file_is_not_said_at_the_worker(
    tmp_path: Path,
) -> None:
    """A review: ``subprocess.run(cmd, stdout=log, stderr=STDOUT, check=True)``, a
    tool's output kept in a log file of its own, got the note that its stderr went "to
    where the task's worker writes its stdout": it went to that file, where it is
    (the worker's stdout has none of it). The note names the file given as stdout=."""
    loud = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    log = tmp_path / "tool.log"
    with open(log, "w") as out, pytest.raises(subprocess.CalledProcessError) as info:
        subprocess.run(loud, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=60)
    assert log.read_text() == "boom\n"
    note_command_output(info.value)
    (note,) = info.value.__notes__
    assert note == MERGED_NOT_CAPTURED_NOTE
    assert (
        "went with its stdout (stderr=subprocess.STDOUT), which was not captured "
        "either, to the file given as stdout=, or else where the task's worker" in note
    )
