"""JSON-lines files cut off mid-write: readers skip the unfinished last line and say so; corruption elsewhere is an
error naming file and line; writers append one evaluation in one write and never glue onto a cut-off line."""

from __future__ import annotations

import json

import pytest

from analysis.loading import AnalysisError, load_samples
from harness.core.jsonl import JsonlError, UnfinishedLineWarning, append_jsonl, read_jsonl, trim_unfinished_last_line

SAMPLES = [
    {
        "stage": "a",
        "step": s,
        "task": "repeat",
        "split": "heldout",
        "prompt": f"p{s}",
        "gold": "g",
        "pred": "g",
        "correct": True,
    }
    for s in range(4)
]


def _cut_file(path, records, cut_bytes=7):
    """The file as a writer killed mid-record leaves it: all complete records, then part of one more."""
    full = "".join(json.dumps(r) + "\n" for r in records)
    extra = json.dumps({"stage": "a", "step": 99, "prompt": "ünïcode cut"})
    path.write_bytes(full.encode() + extra.encode()[:cut_bytes])
    return path


def test_unfinished_last_line_skipped_with_warning_naming_file_and_line(tmp_path):
    path = _cut_file(tmp_path / "samples.jsonl", SAMPLES)
    with pytest.warns(UnfinishedLineWarning, match=rf"{path}:5: unfinished last line"):
        assert read_jsonl(path) == SAMPLES


def test_last_record_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SAMPLES[0]) + "\n" + json.dumps(SAMPLES[1]))
    assert read_jsonl(path) == SAMPLES[:2]


def test_malformed_middle_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [json.dumps(r) for r in SAMPLES]
    lines[2] = lines[2][:-3]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(JsonlError, match=rf"^{path}:3: malformed JSON"):
        read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n{"c": 2}\n')
    with pytest.raises(JsonlError, match=rf"^{path}:2: not valid UTF-8"):
        read_jsonl(path)


def test_load_samples_reads_a_cut_file_and_names_corruption(tmp_path):
    _cut_file(tmp_path / "samples.jsonl", SAMPLES, cut_bytes=30)
    with pytest.warns(UnfinishedLineWarning):
        frame = load_samples(tmp_path)
    assert frame["step"].to_list() == [0, 1, 2, 3]
    with pytest.warns(UnfinishedLineWarning):
        assert load_samples(tmp_path, lazy=True).collect()["step"].to_list() == [0, 1, 2, 3]
    (tmp_path / "samples.jsonl").write_text("{}\n{oops\n{}\n")
    with pytest.raises(AnalysisError, match="samples.jsonl:2: malformed JSON"):
        load_samples(tmp_path)


def test_append_after_a_cut_never_glues_records(tmp_path):
    path = _cut_file(tmp_path / "samples.jsonl", SAMPLES[:2])
    with pytest.warns(UnfinishedLineWarning, match="cut off before appending"):
        assert append_jsonl(path, SAMPLES[2:], run_id="run-b") == 2
    records = read_jsonl(path)  # no warning now: the file ends at a line boundary
    assert [r.get("run_id") for r in records] == [None, None, "run-b", "run-b"]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert list(records[2])[0] == "run_id"


def test_append_is_one_write_per_batch(tmp_path, monkeypatch):
    import builtins

    writes = []
    real_open = builtins.open

    class Spy:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            writes.append(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(builtins, "open", lambda *a, **k: Spy(real_open(*a, **k)))
    path = tmp_path / "s.jsonl"
    append_jsonl(path, SAMPLES, run_id="r")
    assert len(writes) == 1 and writes[0].count(b"\n") == len(SAMPLES)
    assert append_jsonl(path, []) == 0 and len(writes) == 1


def test_trim_completes_or_cuts_the_tail(tmp_path):
    path = tmp_path / "journal.log"
    path.write_text('{"op": 1}\n{"op": 2}')
    assert trim_unfinished_last_line(path) and path.read_text() == '{"op": 1}\n{"op": 2}\n'
    assert not trim_unfinished_last_line(path)
    path.write_text('{"op": 1}\n{"op": 2, "wor')
    with pytest.warns(UnfinishedLineWarning, match="journal.log:2"):
        assert trim_unfinished_last_line(path)
    assert path.read_text() == '{"op": 1}\n'
    assert not trim_unfinished_last_line(tmp_path / "missing.log")


def test_cut_optuna_journal_trimmed_before_append_stays_readable(tmp_path):
    """The fault: a journal line cut by a full disk; optuna reads past it but the next append glues onto it and
    every later reader fails. Trimming first (what the journal lock does before appending) keeps the study whole."""
    optuna = pytest.importorskip("optuna")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = str(tmp_path / "journal.log")

    def study():
        return optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(path)))

    optuna.create_study(study_name="s", storage=JournalStorage(JournalFileBackend(path)))
    study().optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with open(path, "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "cut-')
    with pytest.warns(UnfinishedLineWarning):
        trim_unfinished_last_line(path)
    study().optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(study().trials) == 3 and all(r["op_code"] is not None for r in read_jsonl(path))
