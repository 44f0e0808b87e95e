"""The profile's JSON Schema (sky/profile.schema.json): every shipped profile validates against it with
the `jsonschema` package as an editor's YAML language server would check it, a broken one does not,
each profile names it on its first line, and `launch render` writes it (its `--check`: stale)."""

import copy
import json

import jsonschema
import pytest
import yaml

from launcher import project
from launcher.profiles.profile import load_profile
from launcher.profiles.schema_json import MODELINE, schema_path, schema_text
from walk import REPO, launch

PROFILES = sorted(project.examples_dir().glob("*.yaml"))


@pytest.fixture(scope="module")
def validator():
    schema = json.loads((REPO / "sky" / "profile.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(validator, doc) -> list[tuple[str, str]]:
    return sorted((".".join(map(str, e.absolute_path)), e.validator) for e in validator.iter_errors(doc))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_shipped_profile_validates_against_the_schema(validator, path):
    assert problems(validator, yaml.safe_load(path.read_text())) == []
    load_profile(path.stem)  # and launch takes it: the two agree on the shipped ones


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_profile_names_the_schema_for_its_editor(path):
    first = path.read_text().splitlines()[0]
    assert first == MODELINE
    assert (path.parent / first.split("$schema=")[1]).resolve() == (REPO / "sky" / "profile.schema.json")


BROKEN = [  # (what a user mistypes, where the schema points, the JSON Schema rule that catches it)
    (lambda d: d["train"].update(lerning_rate=1e-4), "train", "additionalProperties"),
    (lambda d: d["train"].update(max_steps="many"), "train.max_steps", "anyOf"),
    (lambda d: d["train"].update(method="lorra"), "train.method", "enum"),
    (lambda d: d["train"].update(learning_rate=-1), "train.learning_rate", "exclusiveMinimum"),
    (lambda d: d.pop("budget"), "", "required"),
    (lambda d: d["cluster"].update(num_nodes=True), "cluster.num_nodes", "type"),
]


@pytest.mark.parametrize("breaks, where, rule", BROKEN, ids=[b[2] for b in BROKEN])
def test_a_broken_profile_does_not_validate(validator, breaks, where, rule):
    doc = copy.deepcopy(yaml.safe_load((REPO / "clusters" / "local-demo.yaml").read_text()))
    breaks(doc)
    assert (where, rule) in problems(validator, doc)


def test_keys_carry_their_docstrings_and_no_derived_titles():
    schema = json.loads(schema_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    max_steps = schema["$defs"]["TrainConfig"]["properties"]["max_steps"]
    assert max_steps["description"].startswith("Stop after this many optimizer steps")
    assert "title" not in max_steps
    assert schema["properties"]["envs"]["description"].startswith("Extra environment variables")


def test_the_committed_schema_is_what_launch_writes():
    assert schema_path() == REPO / "sky" / "profile.schema.json"
    assert schema_path().read_text() == schema_text(), "run `launch render --all` and commit sky/"


def test_render_writes_the_schema_and_check_says_when_it_is_stale(tmp_path):
    proj = tmp_path / "proj"
    (proj / "clusters").mkdir(parents=True)
    (proj / "clusters" / "local-demo.yaml").write_text((REPO / "clusters" / "local-demo.yaml").read_text())
    env = {"LAUNCH_PROJECT": str(proj)}
    r = launch(tmp_path, "render", "--all", env=env)
    assert r.returncode == 0 and "wrote sky/profile.schema.json" in r.stdout, r.stdout + r.stderr
    assert (proj / "sky" / "profile.schema.json").read_text() == schema_text()
    (proj / "sky" / "profile.schema.json").write_text("{}\n")
    r = launch(tmp_path, "render", "--check", env=env)
    assert r.returncode == 1 and "+++ b/sky/profile.schema.json" in r.stdout, r.stdout + r.stderr
