import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THOR = os.path.join(ROOT, "hwconfigs", "thor.yaml")


@pytest.fixture
def thor_path():
    return THOR
