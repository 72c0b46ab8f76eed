"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser of untrusted input: IMDS bodies,
AWS's and Google Cloud's notices, the simulator's StartRequests, etcd values, YAML configs and
the cluster tools' output (crm_mon's XML, crm_simulate's plan). A document that parses is fed on
through the engine (seen, then gone), since a value the parser lets through must not make a
step raise. Any exception other than the parser's own error is a crash: libFuzzer stops and
writes the input to ./crash-*.

    python -m tests.fuzz -max_total_time=600     # `make fuzz`; CI runs 60 s
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import atheris
import yaml

with atheris.instrument_imports():
    from scheduledeventsd import config
    from scheduledeventsd.config import loader
    from scheduledeventsd.coordination.pacemaker import ClusterError, parse_status, transitions
    from scheduledeventsd.coordination.peers import state_of
    from scheduledeventsd.host.hooks import hook_environment, hook_stdin
    from scheduledeventsd.model import Document, DocumentError, parse_document
    from scheduledeventsd.providers import aws, gcp
    from scheduledeventsd.simulators.azure import _start_requests
    from tests.engine.test_properties import step_through_the_engine


def one(data: bytes) -> None:
    try:
        document = parse_document(data)
    except DocumentError:
        pass
    else:
        step_through_the_engine(document)
        to_the_hooks(document)
    _start_requests(data)
    state_of(data)
    for document in (
        aws.document_of(data, data, data, vm_name="i-1", now=1.8e9),
        gcp.document_of(data, data, vm_name="vm", now=1.8e9, seen=gcp.Seen()),
    ):
        step_through_the_engine(document)
        to_the_hooks(document)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    with contextlib.suppress(ClusterError):
        parse_status(text)
    transitions(text)
    with contextlib.suppress(config.ConfigError, yaml.YAMLError):
        loader.parse(loader.parse_yaml(text), "fuzz", check_files=False)


def to_the_hooks(document: Document) -> None:
    """Every event's environment and stdin as the kernel takes them: strict UTF-8, no NUL (a
    lone surrogate in a Description made every hook fail to start)."""
    for event in document.events:
        for key, value in hook_environment(event, "h", 1, "vm", {}).items():
            encoded = f"{key}={value}".encode()
            if b"\0" in encoded:
                raise ValueError(f"NUL in {key}")
        hook_stdin(event, 1, "vm").decode()


# Hostile configs (alias bombs, deep nesting, tags, NaN, ...): where the fuzzer starts. Copied
# to a scratch corpus, since libFuzzer adds what it finds to the first corpus directory.
SEEDS = Path(__file__).parent / "seeds" / "config"
CLUSTER_SEEDS = Path(__file__).parent / "seeds" / "cluster"
# Clouds' notices that once made a parser raise (issue 26 #5: an unreadable window_start_time).
NOTICE_SEEDS = Path(__file__).parent / "seeds" / "notices"


def main() -> None:
    given = [arg for arg in sys.argv[1:] if not arg.startswith("-")]  # a crash to replay
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as corpus:
        for seed in [*SEEDS.iterdir(), *CLUSTER_SEEDS.iterdir(), *NOTICE_SEEDS.iterdir()]:
            shutil.copy(seed, corpus)
        atheris.Setup([*sys.argv, "-max_len=20000", *([] if given else [corpus])], one)
        atheris.Fuzz()


if __name__ == "__main__":
    main()
