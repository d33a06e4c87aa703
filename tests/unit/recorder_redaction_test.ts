/** `--record`: what a reflecting upstream sends back is redacted in the recording file. */
import assert from "node:assert/strict";
import { startRecorder } from "../../lib/run/replay.ts";
import { REDACTED, Redactor } from "../../lib/redact.ts";
import { FakeUpstream } from "./_fake_upstream.ts";
import { tempDir } from "../_helpers.ts";

const KEY = "sk-recorded-upstream-key-5a6b7c8d9e";
const GIT_TOKEN = "ghp_gitTokenTheRedactorKnows0123456789";

Deno.test("startRecorder() redacts the key and every known secret from the recording file", async () => {
  await using dir = await tempDir();
  await using upstream = new FakeUpstream({ key: KEY });
  const redactor = new Redactor();
  redactor.add(GIT_TOKEN);
  const path = `${dir.path}/recording.json`;
  const recorder = startRecorder(
    { name: "fake", kind: "openai", baseUrl: upstream.baseUrl, key: () => Promise.resolve(KEY) },
    path,
    { redactor },
  );
  const post = (body: Record<string, unknown>) =>
    fetch(`${recorder.upstream.baseUrl}/chat/completions`, {
      method: "POST",
      // The credential proxy in front attaches the real key, as here.
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [], ...body }),
    });
  try {
    // An error page that echoes the credential header.
    upstream.behaviour = "echo_credentials";
    const echoed = await post({});
    assert.equal(echoed.status, 400);
    assert.match(
      await echoed.text(),
      new RegExp(KEY),
      "the fake did not echo the key: the test proves nothing",
    );

    // A stream that carries the key and the git token, split across chunks.
    upstream.behaviour = "controlled_stream";
    const started = upstream.nextStream();
    const streamed = post({ stream: true });
    const control = await started;
    control.sendRaw(`data: {"leak":"${KEY.slice(0, 9)}`);
    control.sendRaw(`${KEY.slice(9)} ${GIT_TOKEN.slice(0, 5)}`);
    control.sendRaw(`${GIT_TOKEN.slice(5)}"}\n\n`);
    control.end("[DONE]");
    await (await streamed).text();
  } finally {
    await recorder.close();
  }
  const text = await Deno.readTextFile(path);
  assert.ok(!text.includes(KEY), `the key is in the recording:\n${text}`);
  assert.ok(!text.includes(GIT_TOKEN), `the git token is in the recording:\n${text}`);
  const recording = JSON.parse(text);
  assert.equal(recording.responses.length, 2);
  assert.equal(recording.responses[0].status, 400);
  assert.equal(recording.responses[0].body.error.received, `Bearer ${REDACTED}`);
  assert.equal(
    recording.responses[1].sse,
    `data: {"leak":"${REDACTED} ${REDACTED}"}\n\ndata: [DONE]\n\n`,
  );
});
