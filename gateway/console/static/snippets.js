// The exact request as curl, Python (openai) and TypeScript (openai): the key is always the
// $ENGINEGATE_API_KEY placeholder, never the one typed in the console.
const KEY_VAR = "ENGINEGATE_API_KEY";

export function snippets(origin, path, body) {
  const json = JSON.stringify(body, null, 2);
  const responses = path === "/v1/responses";
  return {
    curl: curl(origin + path, json, body.stream),
    Python: python(origin, body, responses),
    TypeScript: typescript(origin, json, body.stream, responses),
  };
}

function curl(url, json, stream) {
  const quoted = "'" + json.replaceAll("'", "'\\''") + "'";
  return [`curl${stream ? " -N" : ""} ${url} \\`, `  -H "Authorization: Bearer $${KEY_VAR}" \\`,
    `  -H "Content-Type: application/json" \\`, `  -d ${quoted}`].join("\n");
}

// A JSON value as a Python literal (True/False/None; strings via JSON, which Python reads the same).
export function pyLiteral(value, indent = "") {
  const inner = indent + "    ";
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return "[\n" + value.map((v) => inner + pyLiteral(v, inner)).join(",\n") + ",\n" + indent + "]";
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return "{\n" + entries.map(([k, v]) => inner + JSON.stringify(k) + ": " + pyLiteral(v, inner)).join(",\n") + ",\n" + indent + "}";
}

function python(origin, body, responses) {
  const create = responses ? "client.responses.create" : "client.chat.completions.create";
  const lines = ["import os", "", "from openai import OpenAI", "",
    `client = OpenAI(base_url=${JSON.stringify(origin + "/v1")}, api_key=os.environ[${JSON.stringify(KEY_VAR)}])`,
    `request = ${pyLiteral(body)}`, `result = ${create}(**request)`];
  if (!body.stream) lines.push("print(result.model_dump_json(indent=2))");
  else if (responses) lines.push("for event in result:", '    if event.type == "response.output_text.delta":',
    '        print(event.delta, end="", flush=True)', "print()");
  else lines.push("for chunk in result:", "    if chunk.choices and chunk.choices[0].delta.content:",
    '        print(chunk.choices[0].delta.content, end="", flush=True)', "print()");
  return lines.join("\n");
}

function typescript(origin, json, stream, responses) {
  const create = responses ? "client.responses.create" : "client.chat.completions.create";
  const lines = ['import OpenAI from "openai";', "",
    `const client = new OpenAI({ baseURL: ${JSON.stringify(origin + "/v1")}, apiKey: process.env.${KEY_VAR} });`,
    `const result = await ${create}(${json});`];
  if (!stream) lines.push("console.log(JSON.stringify(result, null, 2));");
  else if (responses) lines.push("for await (const event of result) {",
    '  if (event.type === "response.output_text.delta") process.stdout.write(event.delta);', "}");
  else lines.push("for await (const chunk of result) process.stdout.write(chunk.choices[0]?.delta?.content ?? \"\");");
  return lines.join("\n");
}
