"""`reason` sees at most `reason_max_fragments` fragments per side of a linked pair, those nearest
the cluster's centroid, so a pair's prompt and the rules' pairwise checks stay bounded."""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from memory.stages.reason import pair_context
from memory.stages.shard import Cluster, Link


def _cluster(name: str, ts: datetime, n: int, fragments: dict) -> Cluster:
    ids = []
    for i in range(n):
        fid = f"{name}-{i}"
        vec = np.array([1.0, i / n, 0.0], dtype=np.float32)   # member 0 nearest the centroid (1, 0, 0)
        fragments[fid] = {"id": fid, "subject": "u", "category": "factual", "key": f"k{i}",
                          "content": f"c{i}", "date": "", "source_ids": [f"m{i}"], "vector": vec}
        ids.append(fid)
    return Cluster(id=name, user_id="u", session_id=name, session_ts=ts, member_ids=ids,
                   centroid=np.array([1.0, 0.0, 0.0], dtype=np.float32))


def test_each_side_keeps_the_members_nearest_its_centroid_in_order() -> None:
    frags: dict = {}
    pool = _cluster("p", datetime(2024, 1, 1, tzinfo=timezone.utc), 50, frags)
    new = _cluster("c", datetime(2024, 2, 1, tzinfo=timezone.utc), 3, frags)
    link = Link(pool=pool, new=new, similarity=0.9)
    capped = pair_context(link, frags, cap=5)
    assert [f["id"] for f in capped["earlier"]] == [f"p-{i}" for i in range(5)]
    assert [f["id"] for f in capped["later"]] == ["c-0", "c-1", "c-2"]
    whole = pair_context(link, frags)
    assert len(whole["earlier"]) == 50 and "vector" not in whole["earlier"][0]
