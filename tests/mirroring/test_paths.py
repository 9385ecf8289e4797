"""Where mirrors live: names kept whatever their characters, local paths made absolute."""

from __future__ import annotations

import os

from pgoutput_spark.mirroring.names import absolute_path, mirror_path


def test_relative_paths_become_absolute_and_uris_stay_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_path("out/demo") == os.path.join(str(tmp_path), "out", "demo")
    assert absolute_path("/data/mirrors/") == "/data/mirrors"
    for uri in ("s3a://bucket/mirrors", "abfss://c@acct.dfs.core.windows.net/m", "file:/tmp/m", "hdfs:///m"):
        assert absolute_path(uri) == uri
    assert mirror_path("out", "Mixed Case", "t/wo") == os.path.join(str(tmp_path), "out", "Mixed Case", "t%2Fwo")
    assert mirror_path("s3a://b/root/", "public", "_x") == "s3a://b/root/public/%5Fx"
