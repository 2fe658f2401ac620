"""`python -m shadowtopic.shadow.broker`: a shadow broker serves shadow topics through the shadow
feature, so a `--features` list without it is refused before anything starts."""
from __future__ import annotations

import pytest

from shadowtopic.shadow import broker


def test_a_shadow_broker_without_the_shadow_feature_is_refused():
    with pytest.raises(SystemExit, match="--features must include shadow"):
        broker.main(["--features", "compaction", "--data-dir", "/nonexistent"])
