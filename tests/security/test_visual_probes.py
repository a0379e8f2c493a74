"""Attack tests: the shortcut pages of ``rlonce probe visual`` against the real replication grader.

A pasted screenshot, the target loaded from disk or from the network, script that paints the
reference after load or only for an automated browser, a giant page, a copied target image, a
link to a host file: each earns 0 (its gate named). Partial shortcuts (the background alone,
unstyled texts, painting only at the desktop size) stay far below a real replication. A page that
never finishes is covered by the renderer's own attack tests."""

import asyncio

import pytest

from rlonce.envs.visual.env import reference
from rlonce.envs.visual.probe import ROUTES, TOOL_ROUTES, _grade
from rlonce.envs.visual.tasks import make_task

pytestmark = [pytest.mark.browser, pytest.mark.sandbox, pytest.mark.usefixtures("chromium")]

ZERO = {"empty": "no_page", "blank": None, "embedded_screenshot": "embedded_image", "target_from_disk": "runtime",
        "target_from_network": "runtime", "paint_after_load": None, "paint_for_webdriver": None,
        "giant_page": "oversize"}
PARTIAL = ("background_only", "texts_only", "paint_at_desktop_size")


@pytest.fixture(scope="module")
def graded(chromium):
    task = make_task("heldout", 1)

    async def run():
        ref = await reference(task)
        out = {name: await _grade(task, ROUTES[name](task, ref)) for name in (*ZERO, *PARTIAL)}
        out.update({name: await _grade(task, "", cmd) for name, cmd in TOOL_ROUTES.items()})
        out["reference"] = await _grade(task, f"```html\n{task.reference_html}```")
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("route", list(ZERO))
def test_shortcut_pages_earn_nothing(graded, route):
    reward, metrics = graded[route]
    assert reward == 0.0
    if ZERO[route]:
        assert metrics[f"grade/gate_{ZERO[route]}"] == 1.0


def test_a_copied_target_image_and_a_linked_host_file_earn_nothing(graded):
    assert graded["copied_target"][0] == 0.0 and graded["copied_target"][1]["grade/gate_embedded_image"] == 1.0
    assert graded["symlink_answer"][0] == 0.0 and graded["symlink_answer"][1]["grade/gate_no_page"] == 1.0


def test_partial_shortcuts_stay_far_below_a_replication(graded):
    assert graded["reference"][0] == 1.0
    for route in PARTIAL:
        assert graded[route][0] < 0.5, route


@pytest.mark.parametrize("how", ["linked_folder", "climbing_path"])
def test_a_page_folder_outside_the_workspace_is_never_read(tmp_path, how):
    """The host reads the answer's folder as root: a link the agent planted to a host folder, or a
    path that climbs out with ``..``, must not bring a host file (here a perfect page, as a secret
    would be) into the render."""
    from rlonce.envs.visual.env import VisualEnv

    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    task = make_task("heldout", 1)
    (secret / "index.html").write_text(task.reference_html)
    env = VisualEnv(task)

    async def attempt():
        try:
            await env.call_tool("bash", {"command": f"ln -s {secret} site && ls -ld site"})
            answer = "/work/site/index.html" if how == "linked_folder" else f"/work/../../../..{secret}/index.html"
            return env.page_files(answer)
        finally:
            await env.cleanup()

    files, entry, how_found = asyncio.run(attempt())
    assert files is None and entry == "index.html" and how_found.startswith("could not read"), how_found
