"""Nothing lost, tried as a user would (benchmarks/failure_probe.py through the real
launchers): the cheap cases here; the whole probe, every case, from its own command
(`python benchmarks/failure_probe.py`)."""
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
