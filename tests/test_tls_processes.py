"""A cluster over ``wss://`` from the command line: a manager process with
``--tls-cert`` and ``--tls-key``, two worker processes (pools ``a`` and ``b``, so the
worker of ``b`` fetches its input from the one of ``a`` over that worker's own TLS
listener) with the same flags and ``--tls-ca``, and a client in this process trusting
the certificate through ``CORRAL_TLS_CA``; a self-signed certificate for 127.0.0.1.
Without a certificate the manager says what to give it; a client that does not trust
the certificate cannot connect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import ConnectFailed
from tests.helpers import ROOT, Cli, free_port_between, self_signed_pem
from transport.tls import TLS_CA_ENV

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
LIMIT = 60  # seconds per test


def _pem(tmp_path: Path) -> tuple[str, str]:
    cert_pem, key_pem = self_signed_pem()
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    key.chmod(0o600)
    return str(cert), str(key)


def double(x: int) -> int:
    return 2 * x


async def test_a_cluster_runs_over_wss_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _pem(tmp_path)
    tls = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", cert]
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--listen", "wss://127.0.0.1:0", *tls)
        assert address.startswith("wss://127.0.0.1:")
        cli.worker(address, "--pool", "a", *tls)
        cli.worker(address, "--pool", "b", *tls)
        with anyio.fail_after(LIMIT):
            monkeypatch.delenv(TLS_CA_ENV, raising=False)
            with pytest.raises(ConnectFailed, match="TLS"):  # the system's CAs only
                async with Cluster(address):
                    pass  # pragma: no cover - it must not connect
            monkeypatch.setenv(TLS_CA_ENV, cert)
            async with Cluster(address) as c:
                (x,) = await c.submit_graph({"x": (double, 21)}, ["x"], pool="a")
                assert await x == 42  # held: y's "x" is this key
                (y,) = await c.submit_graph({"y": (double, "x")}, ["y"], pool="b")
                assert await y == 84
                status = await c.status()
                # y ran in pool b, so its worker fetched x from pool a's, over TLS
                assert sorted(w.pool for w in status["workers"]) == ["a", "b"]


async def test_a_pools_workers_join_over_wss_with_the_managers_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers a manager's pool starts inherit its ``--tls-*`` files: they verify
    the manager and serve their peers over TLS."""
    cert, key = _pem(tmp_path)
    config = tmp_path / "corral.toml"
    config.write_text('[pools.cpu]\nprovider = "local"\nmin_blocks = 2\ninit_blocks = 2\n')
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager(
            "--listen", "wss://127.0.0.1:0", "--config", str(config), "--tls-cert", cert,
            "--tls-key", key, "--tls-ca", cert,
        )  # fmt: skip
        monkeypatch.setenv(TLS_CA_ENV, cert)
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as c:
                await c.wait_for_workers(2)
                futures = c.map(double, range(20))
                assert await c.gather(futures) == [2 * i for i in range(20)]


def test_a_worker_warns_at_start_when_its_certificate_does_not_name_its_host(
    tmp_path: Path,
) -> None:
    """A worker whose certificate does not name its --host joins (the manager verifies
    nothing of it), but its peers would refuse it: it says so as it starts, with what
    to do, instead of its peers' fetches failing later."""
    cert, key = _pem(tmp_path)  # for 127.0.0.1 and localhost
    tls = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", cert]
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--listen", "wss://127.0.0.1:0", *tls)
        proc = cli.start("worker", address, "--host", "127.0.0.2", *tls)
        line = cli.line_with(proc, "peers would refuse this worker's certificate", LIMIT)
        assert "127.0.0.2" in line and "IP address mismatch" in line
        assert "does not name '127.0.0.2', the host dialled" in line
        assert "a worker's certificate must name its --host" in line
        cli.line_with(proc, "joined", LIMIT)


def test_a_manager_warns_as_it_listens_when_its_certificate_has_expired(
    tmp_path: Path,
) -> None:
    """A manager serving an expired certificate: every client, worker and console fails
    its TLS handshake, and the manager said nothing (multi audit, finding 2). It warns
    as it listens, with OpenSSL's reason and what to do; with a valid one it does not."""
    cert_pem, key_pem = self_signed_pem(expired=True)
    expired = tmp_path / "expired.pem"
    expired.write_bytes(cert_pem + key_pem)
    expired.chmod(0o600)
    cert, key = _pem(tmp_path)
    said = "would refuse this manager's certificate"
    with Cli(tmp_path / "home") as cli:
        bad = cli.start("manager", "--listen", "wss://127.0.0.1:0", "--tls-cert", str(expired),
                        "--no-monitoring")  # fmt: skip
        line = cli.line_with(bad, said, LIMIT)
        assert "reason='certificate has expired'" in line, line
        assert "outside its validity dates" in line and "give it a valid certificate" in line
        good, address = cli.manager(
            "--listen", "wss://127.0.0.1:0", "--tls-cert", cert, "--tls-key", key,
            "--tls-ca", cert, "--no-monitoring",
        )  # fmt: skip
        console = cli.start("console", address, "--tls-ca", cert, "status")
        out = cli.rest(console, LIMIT)
        assert console.wait(LIMIT) == 0, out  # the certificate is good: it connects
        cli.stop([good])
        rest = cli.rest(good, LIMIT)
    assert not any(said in line for line in rest), rest


def test_a_manager_with_an_unusable_tls_ca_listens_and_says_which_file(
    tmp_path: Path,
) -> None:
    """A manager given a --tls-ca it cannot use (a path mistyped, a file that is not
    PEM) listened before it checked its own certificate; with that check it exited 1 at
    once with ``error: FileNotFoundError: [Errno 2] No such file or directory`` or
    ``error: SSLError: [X509: NO_CERTIFICATE_OR_CRL_FOUND] ...``, naming no file. It
    listens, and warns which file and what to give."""
    cert, key = _pem(tmp_path)
    not_pem = tmp_path / "not-pem.txt"
    not_pem.write_text("not a certificate\n")
    said = "cannot check this manager's certificate: its CA file (--tls-ca) is not usable"
    with Cli(tmp_path / "home") as cli:
        for ca in (str(tmp_path / "missing.pem"), str(not_pem)):
            proc = cli.start(
                "manager", "--listen", "wss://127.0.0.1:0", "--tls-cert", cert,
                "--tls-key", key, "--tls-ca", ca, "--no-monitoring",
            )  # fmt: skip
            line = cli.line_with(proc, said, LIMIT)  # (logged before it prints its address)
            assert f"CORRAL_TLS_CA={ca!r}: not a file of CA certificates" in line, line
            assert "give a PEM file (--tls-ca)" in line, line
            cli.line_with(proc, "manager listening on wss://127.0.0.1:", LIMIT)
            cli.stop([proc])


def test_a_console_takes_tls_ca_before_or_after_the_address(tmp_path: Path) -> None:
    """``console --tls-ca FILE`` is the worker's flag: the console verifies a ``wss://``
    manager by FILE, given before the address or after it (where the console's options
    may come), with ``CORRAL_TLS_CA`` unset; without it the handshake fails."""
    cert, key = _pem(tmp_path)
    listen = f"wss://127.0.0.1:{free_port_between(41000, 41999)}"
    with Cli(tmp_path / "home") as cli:
        cli.env.pop(TLS_CA_ENV, None)
        _, address = cli.manager(
            "--listen", listen, "--tls-cert", cert, "--tls-key", key, "--no-monitoring"
        )

        def console(*words: str) -> tuple[int, list[str]]:
            proc = cli.start("console", *words)
            out = cli.rest(proc, LIMIT)
            return proc.wait(LIMIT), out

        for words in ([address, "status", "--tls-ca", cert, "--json"],
                      [f"--tls-ca={cert}", address, "status", "--json"]):  # fmt: skip
            code, out = console(*words)
            assert code == 0, out
            assert '"workers": []' in "".join(out), out
        code, out = console(address, "status")
        assert code == 1 and "TLS handshake failed" in out[-1], out


def test_a_manager_on_wss_without_a_certificate_says_what_to_give(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_TLS_")}
    env.update(CORRAL_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    manager = [sys.executable, "-m", "runtime", "manager", "--listen", "wss://127.0.0.1:0",
               "--no-monitoring"]  # fmt: skip
    done = subprocess.run(manager, env=env, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 1
    assert "--tls-cert" in done.stderr and "CORRAL_TLS_CERT" in done.stderr
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello\n")
    done = subprocess.run(
        [*manager, "--tls-cert", str(bad)], env=env, capture_output=True, text=True,
        timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"CORRAL_TLS_CERT={str(bad)!r}" in done.stderr and "PEM" in done.stderr


def test_tls_flags_without_wss_are_refused_not_ignored(tmp_path: Path) -> None:
    """``--tls-*`` with a ``ws://`` address would serve (and send tokens in) plaintext
    whatever the file holds: the manager and the worker refuse them at once, saying to
    use ``wss://``, and start nothing (no run directory, no token file)."""
    cert, _ = _pem(tmp_path)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), PYTHONPATH=str(ROOT))

    def run(*args: str) -> str:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "runtime", *args], env=env, capture_output=True,
                text=True, timeout=LIMIT,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"it ran: {exc.stdout!r}") from None
        assert done.returncode == 1
        assert "listening" not in done.stdout and "joined" not in done.stdout
        return done.stderr.strip().splitlines()[-1]

    for flags in (["--tls-cert", cert], ["--tls-cert", str(tmp_path / "missing.pem")],
                  ["--tls-ca", cert]):  # fmt: skip
        err = run("manager", "--listen", "127.0.0.1:0", *flags)
        assert err.startswith(f"error: ValueError: {flags[0]} given, but --listen 127.0.0.1:0")
        assert "Use --listen wss://HOST:PORT for TLS, or drop the --tls-* flags" in err
    err = run("manager", "--listen", "ws://127.0.0.1:0", "--tls-cert", cert, "--tls-key", cert)
    assert "--tls-cert and --tls-key given, but --listen ws://127.0.0.1:0 is not wss://" in err
    assert not home.exists()
    # A worker of a ws:// manager would join it, and serve its peers, in plaintext.
    err = run("worker", "ws://127.0.0.1:9", "--tls-cert", cert, "--tls-ca", cert)
    assert "--tls-cert and --tls-ca given, but the manager's address ws://127.0.0.1:9" in err
    assert "Join wss://HOST:PORT for TLS, or drop the --tls-* flags" in err
    # A console of a ws:// manager would connect in plaintext, the flag before or after
    # the address (not taken as the command word, after connecting).
    for words in (["ws://127.0.0.1:9", "status", "--tls-ca", cert],
                  ["--tls-ca", cert, "ws://127.0.0.1:9", "status"]):  # fmt: skip
        err = run("console", *words)
        assert err.startswith(
            "error: ValueError: --tls-ca given, but the manager's address ws://127.0.0.1:9 "
            "is not wss://: the console would connect over plaintext ws://"
        ), err
        assert "Connect to wss://HOST:PORT for TLS, or drop the --tls-* flags" in err
