// Server-sent events from a fetch() body: yields {event, data} per event as its bytes arrive.
export async function* readSSE(stream) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = boundary(buffer)) !== null) {
        const block = buffer.slice(0, cut.at);
        buffer = buffer.slice(cut.at + cut.length);
        const event = parse(block);
        if (event) yield event;
      }
    }
    const event = parse(buffer + decoder.decode());
    if (event) yield event;
  } finally {
    reader.releaseLock();
  }
}

function boundary(text) {
  const m = /\r?\n\r?\n/.exec(text);
  return m ? { at: m.index, length: m[0].length } : null;
}

function parse(block) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}
