"""shadowtopic.testing stays usable without pytest (not a dependency of the package): importing
it loads no pytest, and it defines its fixtures only when pytest is there."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, sys
import shadowtopic.testing as t
print(json.dumps({"pytest": "pytest" in sys.modules,
                  "fixtures": "shadowtopic_client" in vars(t)}))
"""


def test_importing_shadowtopic_testing_does_not_import_pytest():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, check=True, env=dict(os.environ)).stdout
    assert json.loads(out) == {"pytest": False, "fixtures": False}


def test_under_pytest_the_module_is_a_plugin_with_its_fixtures():
    from shadowtopic.testing import shadowtopic_client, shadowtopic_standalone, shadowtopic_topic

    assert all(map(callable, (shadowtopic_standalone, shadowtopic_client, shadowtopic_topic)))
