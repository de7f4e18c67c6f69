"""In the README's engine commands, tested in CI: an engine's venv has no plotting stack, so
importing any of it fails here, as it would there."""

import sys

ABSENT = ("matplotlib", "cycler", "pandas", "IPython", "ipywidgets", "threadpoolctl")


class Absent:
    """A meta-path finder that refuses the modules of ABSENT."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked: not in an engine's venv)"
            )
        return None


sys.meta_path.insert(0, Absent())
