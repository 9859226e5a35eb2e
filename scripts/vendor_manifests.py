"""Keep the pinned release manifests (decisions/catalog/charts.yaml `manifests`) in the repository, as their releases
publish them.

    .venv/bin/python scripts/vendor_manifests.py [NAME ...]         download each pin's url, check it against its sha256
    .venv/bin/python scripts/vendor_manifests.py NAME --pin         keep the downloaded file and pin its sha256
    .venv/bin/python scripts/vendor_manifests.py --check            offline: every kept copy is the file its pin names

Without --pin a download whose sha256 is not the pin's changes nothing: the script says whether the file differs from
the kept copy in its bytes only (the same objects) or in objects, and which, then exits 1. To move to a new release,
change the pin's url, version and file in charts.yaml, run with --pin, and review the objects the plan then shows.
The program reads only the kept copies (decisions/catalog/charts.py read_manifest): nothing is fetched at `pulumi up`.
Exit codes: 0 done, 1 a digest or object differs, 2 a download failed or a name is not pinned.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decisions.catalog import charts  # noqa: E402

TIMEOUT_S = 60


def download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:     # GitHub's release URLs redirect; urllib follows
        return response.read()


def _identities(text: bytes) -> Dict[Tuple[str, str, str, str], dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return {(d.get("apiVersion", ""), d.get("kind", ""), (d.get("metadata") or {}).get("namespace") or "",
             (d.get("metadata") or {}).get("name", "")): d for d in yaml.load_all(text, Loader=loader) if d}


def _label(key: Tuple[str, str, str, str]) -> str:
    api_version, kind, namespace, name = key
    return f"{kind} {namespace + '/' if namespace else ''}{name} ({api_version})"


def object_differences(kept: bytes, release: bytes) -> List[str]:
    """What differs between two manifests object by object: 'added KIND ns/name', 'removed ...', 'changed ...'."""
    before, after = _identities(kept), _identities(release)
    return ([f"added {_label(k)}" for k in after if k not in before]
            + [f"removed {_label(k)}" for k in before if k not in after]
            + [f"changed {_label(k)}" for k in before if k in after and before[k] != after[k]])


def vendor(name: str, pin: charts.ManifestPin, *, fetch: Callable[[str], bytes] = download,
           directory: Path = charts.CHARTS_PATH.parent, charts_file: Path = charts.CHARTS_PATH,
           pin_new: bool = False) -> Tuple[int, List[str]]:
    """Download `pin.url` and keep it where its digest is the pin's (or, with `pin_new`, pin the new digest).
    Returns (exit code, lines to print)."""
    release = fetch(pin.url)
    digest = hashlib.sha256(release).hexdigest()
    path = directory / pin.file
    kept = path.read_bytes() if path.is_file() else b""
    if digest == pin.sha256:
        if kept != release:
            path.write_bytes(release)
            return 0, [f"{name} {pin.version}: kept the release's file ({pin.file}, sha256 {digest})"]
        return 0, [f"{name} {pin.version}: the kept copy is the release's file (sha256 {digest})"]
    if pin_new:
        text = charts_file.read_text(encoding="utf-8")
        if text.count(pin.sha256) != 1:
            return 2, [f"{name}: its pinned sha256 {pin.sha256} is not in {charts_file} exactly once; edit it by hand"]
        path.write_bytes(release)
        charts_file.write_text(text.replace(pin.sha256, digest), encoding="utf-8")
        return 0, [f"{name} {pin.version}: kept the release's file ({pin.file}) and pinned its sha256 {digest}"]
    differences = object_differences(kept, release) if kept else ["no kept copy"]
    lines = [f"{name} {pin.version}: the release's file has sha256 {digest}, not the pinned {pin.sha256}"]
    lines += (["  the same objects as the kept copy, in other bytes; --pin keeps the release's bytes"]
              if not differences else [f"  {d}" for d in differences] + ["  review, then --pin keeps the release's file"])
    return 1, lines


def check(names: Sequence[str]) -> Tuple[int, List[str]]:
    """Offline: each kept copy is the file its pin's sha256 names."""
    code, lines = 0, []
    for name in names:
        try:
            objects = charts.read_manifest(name, charts.manifest(name))
            lines.append(f"{name} {charts.manifest(name).version}: {len(objects)} objects, sha256 as pinned")
        except charts.ManifestDigestError as error:
            code, lines = 1, lines + [str(error)]
    return code, lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="vendor_manifests.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="manifests to refresh (default: every pinned one)")
    parser.add_argument("--pin", action="store_true", help="keep the downloaded file and pin its sha256")
    parser.add_argument("--check", action="store_true", help="only check the kept copies against their pins, offline")
    args = parser.parse_args(argv)
    pins: Mapping[str, charts.ManifestPin] = charts.load_charts().manifests
    unknown = sorted(set(args.names) - set(pins))
    if unknown:
        print(f"not pinned: {', '.join(unknown)}; pinned: {', '.join(sorted(pins))}", file=sys.stderr)
        return 2
    names = args.names or sorted(pins)
    if args.check:
        code, lines = check(names)
        print("\n".join(lines))
        return code
    worst = 0
    for name in names:
        try:
            code, lines = vendor(name, pins[name], pin_new=args.pin)
        except OSError as error:        # urllib's URLError and HTTPError are OSErrors
            code, lines = 2, [f"{name}: downloading {pins[name].url} failed: {error}"]
        print("\n".join(lines))
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main())
