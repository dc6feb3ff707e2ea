"""Nothing lost, tried as a user would (benchmarks/failure_probe.py through the real
launchers): the cheap cases here; the whole probe, every case, from its own command
(`python benchmarks/failure_probe.py`), and the dead store alone (it needs the test extra)."""
import json

import pytest

from benchmarks import failure_probe

CHEAP = ("config_and_data_change", "eval_bad_path")   # (a damaged cache: test_token_cache.py)


@pytest.mark.slow
def test_the_cheap_failure_cases_end_cleanly(tmp_path, capsys):
  rc = failure_probe.main([f"--work_dir={tmp_path}", f"--only={','.join(CHEAP)}"])
  out = capsys.readouterr().out
  summary = json.loads(out.strip().splitlines()[-1])
  assert rc == 0 and summary["failed"] == [] and summary["cases"] == len(CHEAP), out


@pytest.mark.slow
def test_every_failure_case_ends_cleanly(tmp_path, capsys):
  rc = failure_probe.main([f"--work_dir={tmp_path}"])
  out = capsys.readouterr().out
  assert rc == 0, out


@pytest.mark.slow
def test_a_store_killed_mid_run_ends_the_run_within_its_budget(tmp_path, capsys):
  """Issue 57's bar with the project's GCS emulator killed while a run reads its token cache
  from it (failure_probe's dead_store): one error line, a saved checkpoint, the exit within
  VMX_REMOTE_RETRY_S + 30 s of the outage, and the rerun resumes."""
  pytest.importorskip("gcsfs", reason="gcsfs (test extra) is not installed")
  pytest.importorskip("gcp_storage_emulator",
                      reason="gcp-storage-emulator (test extra) is not installed")
  rc = failure_probe.main([f"--work_dir={tmp_path}", "--only=dead_store"])
  out = capsys.readouterr().out
  assert rc == 0 and "ok   dead_store" in out, out
