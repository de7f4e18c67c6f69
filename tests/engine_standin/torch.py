"""`import torch` in the README's engine commands, tested in CI: the torch-like stand-in."""

from torchlike import *  # noqa: F403
