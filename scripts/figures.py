"""Write every figure of the book to a folder, as PNG and SVG: python scripts/figures.py DIR."""

import sys
from pathlib import Path

import matplotlib.pyplot as plt

import specdec_core as sc


def main(folder):
    """Build each figure in sc.FIGURES and save it twice; print what was written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, build in sc.FIGURES.items():
        figure = build()
        for suffix in ("png", "svg"):
            figure.savefig(
                folder / f"{name}.{suffix}", metadata={"Date": None} if suffix == "svg" else None
            )
        plt.close(figure)
        print(f"{folder / name}.png and .svg")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "figures")
