"""Where varbench finds its data (a checkout's folders, else the installed copies under bench/_data) and
where it writes by default (a flag, else an environment variable, else a folder of the current one)."""
from pathlib import Path

import pytest

from bench import resources
from bench.io import SOURCE_ROOT


def test_a_checkout_uses_its_own_folders():
    assert resources._is_checkout(SOURCE_ROOT)
    for name in resources.RESOURCES:
        assert resources.resource_dir(name) == SOURCE_ROOT / name
    assert resources.tiny_assets_dir() == SOURCE_ROOT / "assets" / "tiny"


def _layout(tmp_path, monkeypatch, pyproject=None, data=()):
    src, pkg = tmp_path / "src", tmp_path / "src" / "bench"
    pkg.mkdir(parents=True)
    if pyproject is not None:
        (src / "pyproject.toml").write_text(pyproject)
    for name in data:
        (pkg / "_data" / name).mkdir(parents=True)
    monkeypatch.setattr(resources, "SOURCE_ROOT", src)
    monkeypatch.setattr(resources, "PACKAGE_ROOT", pkg)
    return src, pkg


def test_an_install_uses_the_package_data(tmp_path, monkeypatch):
    src, pkg = _layout(tmp_path, monkeypatch, data=("tables", "assets/tiny"))
    (src / "tables").mkdir()                            # site-packages/tables of another package: not ours
    assert not resources._is_checkout(src)
    assert resources.resource_dir("tables") == pkg / "_data" / "tables"
    assert resources.tiny_assets_dir() == pkg / "_data" / "assets" / "tiny"


def test_another_projects_pyproject_is_not_a_checkout(tmp_path, monkeypatch):
    src, pkg = _layout(tmp_path, monkeypatch, pyproject='[project]\nname = "other"\n', data=("datasets",))
    (src / "datasets").mkdir()
    assert not resources._is_checkout(src)
    assert resources.resource_dir("datasets") == pkg / "_data" / "datasets"
    (src / "pyproject.toml").write_text('[project]\nname = "varbench"\n')
    assert resources._is_checkout(src) and resources.resource_dir("datasets") == src / "datasets"
    (src / "pyproject.toml").write_bytes(b'name = "varbench"\n# \xff\xfe not UTF-8\n')
    assert resources._is_checkout(src)                  # undecodable bytes are replaced, not an error
    (src / "pyproject.toml").unlink()
    (src / "pyproject.toml").mkdir()                    # not a file
    assert not resources._is_checkout(src)


def test_a_checkout_without_the_folder_falls_back_to_the_package_data(tmp_path, monkeypatch):
    src, pkg = _layout(tmp_path, monkeypatch, pyproject='name = "varbench"\n', data=("figures",))
    assert resources.resource_dir("figures") == pkg / "_data" / "figures"


def test_a_missing_resource_names_where_it_looked(tmp_path, monkeypatch):
    src, pkg = _layout(tmp_path, monkeypatch, pyproject='name = "varbench"\n')
    with pytest.raises(FileNotFoundError) as e:
        resources.resource_dir("sweeps")
    assert str(e.value) == (f"varbench's sweeps/ folder is missing (looked in {src / 'sweeps'}, "
                            f"{pkg / '_data' / 'sweeps'}); reinstall varbench")
    assert resources.resource_dir("sweeps", required=False) is None
    (src / "pyproject.toml").unlink()
    with pytest.raises(FileNotFoundError, match=r"\(looked in [^,]*_data/sweeps\)"):   # not a checkout: one place
        resources.resource_dir("sweeps")


def test_an_unknown_resource_lists_the_known_ones():
    with pytest.raises(ValueError) as e:
        resources.resource_dir("table")
    assert str(e.value) == "unknown resource 'table'; one of " + ", ".join(resources.RESOURCES)


def test_the_tiny_folder_can_be_moved_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path))
    assert resources.tiny_assets_dir() == tmp_path
    monkeypatch.setenv("VARBENCH_TINY_DIR", "")        # empty: unset
    assert resources.tiny_assets_dir() == SOURCE_ROOT / "assets" / "tiny"


@pytest.mark.parametrize("fn, env, default", [(resources.results_root, "VARBENCH_RESULTS", Path("results")),
                                              (resources.tables_out_dir, "VARBENCH_TABLES_OUT", Path("tables/out")),
                                              (resources.figures_out_dir, "VARBENCH_FIGURES_OUT", Path("figures/out"))])
def test_output_folders_flag_then_environment_then_default(fn, env, default, monkeypatch):
    monkeypatch.delenv(env, raising=False)
    assert fn() == default and fn(None) == default and fn("") == default
    monkeypatch.setenv(env, "")
    assert fn() == default
    monkeypatch.setenv(env, "/from/env")
    assert fn() == Path("/from/env")
    assert fn("given") == Path("given") and fn(Path("/p")) == Path("/p")
