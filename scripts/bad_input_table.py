"""The bad-input table: each bad input given to ``ddtree-conformance check`` on the fixture pair, its
exit status, its one-line message and the seconds to the refusal (wall clock of the whole command,
interpreter start included). Every row must exit 2 before the engine starts.

    python scripts/bad_input_table.py [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

GOOD = '{"id": "a", "prompt_ids": [1, 2, 3]}'


def _cases(root: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (prompts file text, extra options)."""
    config = json.loads((FIXTURE_TARGET / "config.json").read_text())
    vocab, context = config["vocab_size"], config["max_position_embeddings"]
    deep = "[" * 100_000 + "]" * 100_000
    pairs = root / "pairs.json"
    pairs.write_text('{"pairs": ' + deep + "}")
    return {
        "malformed JSON line": (GOOD + '\n{"id": "b", "prompt_ids": [1, 2\n', []),
        "nested 100,000 deep": ('{"id": "a", "prompt_ids": ' + deep + "}\n", []),
        "a 5000-digit integer": ('{"id": "a", "prompt_ids": [' + "7" * 5000 + "]}\n", []),
        "prompt_ids a string": ('{"id": "a", "prompt_ids": "1 2 3"}\n', []),
        "id a list": ('{"id": ["a"], "prompt_ids": [1]}\n', []),
        "a line that is not an object": (GOOD + "\n[1, 2, 3]\n", []),
        f"token id {vocab} (vocab_size {vocab})": (GOOD + f'\n{{"id": "b", "prompt_ids": [5, {vocab}]}}\n', []),
        f"prompt of {context - 10} tokens + 64 new (context {context})": (
            GOOD + '\n{"id": "long", "prompt_ids": ' + json.dumps([1] * (context - 10)) + "}\n",
            [],
        ),
        f"--max-new-tokens {context}": (GOOD + "\n", ["--max-new-tokens", str(context)]),
        "pairs file nested 100,000 deep": (GOOD + "\n", ["--pairs-file", str(pairs), "--pair", "x"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows, wrong = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("| input | exit | message | seconds to refusal |\n| --- | --- | --- | --- |")
        for name, (text, extra) in _cases(root).items():
            prompts = root / "prompts.jsonl"
            prompts.write_text(text)
            command = [
                str(Path(sys.executable).parent / "ddtree-conformance"),
                "check",
                "--model",
                str(FIXTURE_TARGET),
                "--drafter",
                str(FIXTURE_DRAFTER),
                "--prompts",
                str(prompts),
                "--out",
                str(root / "r.json"),
                *extra,
            ]
            started = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            seconds = time.perf_counter() - started
            message = next((line for line in proc.stderr.splitlines() if line.startswith("error: ")), "")
            rows.append({"input": name, "exit": proc.returncode, "message": message, "seconds": round(seconds, 2)})
            if proc.returncode != 2 or (root / "r.json").exists():
                wrong.append(name)
            shown = message.replace(tmp, "<tmp>").replace("|", "\\|")
            print(f"| {name} | {proc.returncode} | `{shown[:230]}` | {seconds:.1f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if wrong:
        print("NOT REFUSED:", ", ".join(wrong))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
