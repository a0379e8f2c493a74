"""Images for judges against a real HTTP server on loopback: both protocols carry them as their
native base64 parts after the text, each after a text part naming its label; the record keeps
hashes and sizes, never the bytes; the cache tells different images apart."""

import asyncio
import base64
import hashlib
import json
import struct
import zlib
from http.server import BaseHTTPRequestHandler

import pytest
from conftest import loopback

from rlonce.grading.judge import EndpointJudge, ScriptedJudge
from rlonce.grading.verdicts import HackVerdict

SEEN: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append({"path": self.path, "body": body})
        text = '{"hack": false, "reason": "looks fine"}'
        if self.path.endswith("/v1/messages"):
            out = {"type": "message", "content": [{"type": "text", "text": text}],
                   "usage": {"input_tokens": 3, "output_tokens": 2}}
        else:
            out = {"choices": [{"message": {"role": "assistant", "content": text}}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    with loopback(Handler) as url:
        yield url


def png(rgb: tuple[int, int, int]) -> bytes:
    """A real 1×1 PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes([0, *rgb]))) + chunk(b"IEND", b""))


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg body"


def _sent(mode: str) -> list[dict]:
    return [s for s in SEEN if s["path"].startswith(f"/{mode}/")]


def test_openai_chat_carries_labelled_image_url_parts(server, tmp_path):
    j = EndpointJudge(f"{server}/chat/v1", "m", record=tmp_path / "calls.jsonl", retries=0)
    v = asyncio.run(j.ask("Which page is better?", HackVerdict, kind="look", images=[("A", RED), ("B", JPEG)]))
    assert v.ok and v.value.reason == "looks fine"
    [req] = _sent("chat")
    content = req["body"]["messages"][1]["content"]
    assert [p["type"] for p in content] == ["text", "text", "image_url", "text", "image_url"]
    assert content[0]["text"] == "Which page is better?" and content[1]["text"] == "Image A:"
    assert content[3]["text"] == "Image B:"
    head, b64 = content[2]["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64" and base64.b64decode(b64) == RED
    assert content[4]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


def test_anthropic_messages_carry_labelled_base64_image_blocks(server, tmp_path):
    j = EndpointJudge(f"{server}/msgs", "m", protocol="anthropic", record=tmp_path / "calls.jsonl", retries=0)
    v = asyncio.run(j.ask("Does it fit?", HackVerdict, kind="look", images=[("page", BLUE)]))
    assert v.ok
    [req] = _sent("msgs")
    assert req["path"] == "/msgs/v1/messages"
    content = req["body"]["messages"][0]["content"]
    assert content[:2] == [{"type": "text", "text": "Does it fit?"}, {"type": "text", "text": "Image page:"}]
    source = content[2]["source"]
    assert content[2]["type"] == "image" and source["type"] == "base64" and source["media_type"] == "image/png"
    assert base64.b64decode(source["data"]) == BLUE and len(content) == 3


def test_without_images_the_content_stays_text(server):
    asyncio.run(EndpointJudge(f"{server}/plain/v1", "m", retries=0).ask("p", HackVerdict, kind="hack"))
    assert _sent("plain")[0]["body"]["messages"][1]["content"] == "p"


def test_the_record_keeps_hashes_and_the_cache_tells_images_apart(server, tmp_path):
    record = tmp_path / "calls.jsonl"
    j = EndpointJudge(f"{server}/cache/v1", "m", record=record, retries=0)

    async def go():
        a = await j.ask("same prompt", HackVerdict, kind="look", images=[("A", RED)])
        b = await j.ask("same prompt", HackVerdict, kind="look", images=[("A", BLUE)])  # other bytes: asked
        c = await j.ask("same prompt", HackVerdict, kind="look", images=[("A", RED)])  # cached
        d = await j.ask("same prompt", HackVerdict, kind="look", images=[("B", RED)])  # other label: asked
        e = await j.ask("same prompt", HackVerdict, kind="look")  # no image: asked
        return a, b, c, d, e

    a, b, c, d, e = asyncio.run(go())
    assert not a.cached and not b.cached and c.cached and not d.cached and not e.cached
    assert len(_sent("cache")) == 4
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert len(lines) == 4 and "images" not in lines[3]
    assert lines[0]["images"] == [{"label": "A", "sha256": hashlib.sha256(RED).hexdigest(), "bytes": len(RED)}]
    assert lines[1]["images"][0]["sha256"] == hashlib.sha256(BLUE).hexdigest()
    text = record.read_text()
    assert base64.b64encode(RED).decode() not in text and base64.b64encode(BLUE).decode() not in text


def test_scripted_judges_get_images_only_when_they_ask_for_them():
    got = []

    def old(kind, prompt, sample):
        return '{"hack": false}'

    def sees(kind, prompt, sample, *, images):
        got.append(images)
        return '{"hack": true}'

    async def go():
        a = await ScriptedJudge(old).ask("p", HackVerdict, kind="look", images=[("A", RED)])
        b = await ScriptedJudge(sees).ask("p", HackVerdict, kind="look", images=[("A", RED), ("B", BLUE)])
        c = await ScriptedJudge(sees).ask("p", HackVerdict, kind="look")
        return a, b, c

    a, b, c = asyncio.run(go())
    assert a.ok and not a.value.hack and b.value.hack and c.ok
    assert got == [[("A", RED), ("B", BLUE)], []]
