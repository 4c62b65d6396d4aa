"""facourse.results.show: the one cell a lecture uses to print a committed result, or say there is none."""
from facourse import results


def test_show_prints_the_header_and_the_table(capsys):
    d = results.show("10", results.variant_table)
    out = capsys.readouterr().out
    assert d is not None and out.startswith(results.header(d)) and results.variant_table(d) in out


def test_show_prints_the_kinds_table_by_default(capsys):
    d = results.show("09")
    assert d is not None and results.decode_table(d) in capsys.readouterr().out


def test_show_says_when_nothing_is_committed(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MEASURED", tmp_path / "measured.json")
    assert results.show("10") is None
    assert capsys.readouterr().out == ("No GPU measurement of step 10 is committed yet "
                                       "(course/results/measured.json has no \"10\").\n")
    assert results.show("11_traces", missing="none here") is None
    assert capsys.readouterr().out == "none here\n"
