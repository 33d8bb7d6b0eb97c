"""Build hook: a wheel carries the notebooks, presets and rule tables inside the package.

They live once in the repository (notebooks/, data/presets/, data/aiter/) and are copied into
gdn_lab/_data/<kind>/ of the build (gdn_lab/package_data.py reads them there). Editable installs
read the repository's folders directly. Everything else is in pyproject.toml.
"""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LAYOUT = runpy.run_path(str(ROOT / "gdn_lab" / "package_data.py"))["LAYOUT"]


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for kind, (folder, pattern) in LAYOUT.items():
            files = sorted((ROOT / folder).glob(pattern))
            if not files:
                raise SystemExit(f"setup.py: no {pattern} in {folder}/: the wheel would lack its {kind}")
            dest = Path(self.build_lib) / "gdn_lab" / "_data" / kind
            dest.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, dest / f.name)


setup(cmdclass={"build_py": BuildPyWithData})
