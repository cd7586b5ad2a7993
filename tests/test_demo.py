"""The README's interim main job runs end to end."""

from jaxformer import demo


def test_demo_runs(capsys):
  demo.main()
  out = capsys.readouterr().out
  assert "KV-cache decoding" in out and "blocked MiB" in out
