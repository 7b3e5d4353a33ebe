"""lobster_io over an S3-compatible server: moto's, serving over HTTP on loopback (a real
server, no mock of the client). Samples read from a bucket are the same, in the same order,
as from the folder they were uploaded from, and each rank under torchrun gets
DistributedSampler's share."""

import json
import os
import subprocess
import sys

import pytest

import lobster_io
from test_loader import make_folder
from test_torch import HERE, sampler_shares

moto_server = pytest.importorskip("moto.server", reason="moto[s3,server] is not installed")
boto3 = pytest.importorskip("boto3")

BUCKET = "lobster-test"


@pytest.fixture(scope="module")
def server():
    s = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s.start()
    host, port = s.get_host_and_port()
    yield f"http://{host}:{port}"
    s.stop()


@pytest.fixture
def s3_env(server, monkeypatch):
    """The AWS variables that point lobster_io (and boto3) at the server."""
    env = {
        "AWS_ENDPOINT_URL": server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_REGION": "us-east-1",
        # The profile files of whoever runs the tests are not read.
        "AWS_CONFIG_FILE": "/nonexistent/lobster-test-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/lobster-test-credentials",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def upload(env, root, prefix):
    """Uploads every file under `root` to `prefix/...` of the test bucket."""
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing-secret")
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for path in sorted(root.rglob("*")):
        if path.is_file():
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{path.relative_to(root)}",
                          Body=path.read_bytes())


def test_a_folder_in_a_bucket_loads_as_the_local_folder(tmp_path, s3_env):
    make_folder(tmp_path / "data", 37, 3)
    upload(s3_env, tmp_path / "data", "same")
    seen, requests = {}, {}
    for name, data in [("local", str(tmp_path / "data")), ("s3", f"s3://{BUCKET}/same")]:
        loader = lobster_io.Loader(data, 5, seed=7, image_size=16, epochs=2)
        batches = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for b in loader:
                batches.append((b.ids.tolist(), b.labels.tolist(), bytes(b.images)))
        requests[name] = loader.metrics()["object_requests_by_epoch"]
        loader.close()
        seen[name] = batches
    assert seen["s3"] == seen["local"]
    # One object per sample: the first epoch GETs every one; for local files the list is empty.
    assert len(requests["s3"]) == 2 and requests["s3"][0] >= 37, requests
    assert requests["local"] == [], requests
    shares, _ = sampler_shares(tmp_path / "data", 1, 0, 7, 5)
    assert [i for ids, _, _ in seen["s3"][:8] for i in ids] == shares[0][0]


def test_each_rank_under_torchrun_gets_distributed_sampler_share_from_a_bucket(tmp_path, s3_env):
    make_folder(tmp_path / "data", 41, 4)
    upload(s3_env, tmp_path / "data", "ranks")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE))
    out = tmp_path / "rank{rank}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(29600 + os.getpid() % 1000), str(HERE / "rank_probe.py"),
           f"s3://{BUCKET}/ranks", str(out), "4", "2"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in seen, seen
        for epoch in range(2):
            shares, _ = sampler_shares(tmp_path / "data", 2, epoch, 11, 4)
            ids, labels = shares[rank]
            assert seen["epochs"][epoch]["ids"] == ids, f"rank {rank} epoch {epoch}"
            assert seen["epochs"][epoch]["labels"] == labels, f"rank {rank} epoch {epoch}"


def test_a_missing_bucket_or_key_is_named_and_no_secret_is_shown(tmp_path, s3_env, monkeypatch):
    make_folder(tmp_path / "data", 6, 2)
    upload(s3_env, tmp_path / "data", "errs")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3CR3T-canary")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "T0K3N-canary")
    with pytest.raises(lobster_io.Error, match="no-such-bucket") as missing:
        lobster_io.Loader("s3://no-such-bucket/data", 2, image_size=8)
    with pytest.raises(lobster_io.Error, match=r"errs/shard-000000\.tar: no such object") as no_key:
        lobster_io.Loader(f"s3://{BUCKET}/errs/shard-{{000000..000001}}.tar", 2, image_size=8)
    for e in (missing.value, no_key.value):
        assert "S3CR3T-canary" not in str(e) and "T0K3N-canary" not in str(e), str(e)
