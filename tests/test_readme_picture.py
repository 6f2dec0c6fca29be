"""The README's picture is drawn by scripts/readme_picture.py from a demo run's logs (issue #53),
not edited by hand: the script reads both stages' eval.jsonl, and the README shows its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path, points: list[tuple[int, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "eval/success": p, "eval/success_lo": p - 0.1,
                                        "eval/success_hi": p + 0.1, "eval/episodes": 128.0}) + "\n"
                            for s, p in points))


def test_the_picture_is_drawn_from_a_runs_two_stages(tmp_path):
    run = tmp_path / "demo"
    _rows(run / "sft" / "eval.jsonl", [(0, 0.04), (60, 0.49)])
    _rows(run / "eval.jsonl", [(0, 0.49), (40, 0.58)])
    out = tmp_path / "picture.png"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_picture.py"), str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_picture.py"), str(tmp_path), "--out",
                            str(tmp_path / "none.png"), "--config", ""], capture_output=True, text=True, timeout=120)
    assert empty.returncode != 0 and "no evaluations" in empty.stderr and not (tmp_path / "none.png").exists()


def test_the_readme_shows_the_scripts_picture():
    readme = (ROOT / "README.md").read_text()
    assert "![" in readme and "(docs/img/demo_heldout.png)" in readme and "scripts/readme_picture.py" in readme
    assert (ROOT / "docs" / "img" / "demo_heldout.png").is_file()
