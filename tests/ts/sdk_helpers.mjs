// The official OpenAI TypeScript SDK's helpers against a real gateway: GATEWAY_URL (…/v1) and MODEL.
// Prints one JSON object of what each helper produced; the Python test asserts on it.
import OpenAI from 'openai';
import { makeParseableResponseFormat } from 'openai/lib/parser.mjs';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL, apiKey: 'unused', maxRetries: 0, timeout: 300_000 });
const model = process.env.MODEL;
const WEATHER = { type: 'object', properties: { city: { type: 'string', maxLength: 20 } }, required: ['city'],
                  additionalProperties: false };
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather in a city', parameters: WEATHER, strict: true } },
  { type: 'function', function: { name: 'get_time', description: 'Local time in a city', parameters: WEATHER, strict: true } },
];
const calls = (message) => (message.tool_calls ?? []).map((c) => ({
  id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments, parsed: c.function.parsed_arguments ?? null,
}));
const out = {};

// chat.completions.stream(): the streamed call accumulated by the SDK, and its argument events
const stream = client.chat.completions.stream({ model, messages: ask, tools, tool_choice: 'required', max_tokens: 60, temperature: 0 });
const doneEvents = [];
stream.on('tool_calls.function.arguments.done', (e) => doneEvents.push({ name: e.name, arguments: e.arguments }));
out.stream_calls = calls((await stream.finalChatCompletion()).choices[0].message);
out.stream_done_events = doneEvents;

// runTools(): the SDK runs the named function with the parsed arguments, then stops (a named tool_choice)
const ran = [];
const runner = client.chat.completions.runTools({
  model, messages: ask, max_tokens: 60, temperature: 0, stream: true,
  tool_choice: { type: 'function', function: { name: 'get_weather' } },
  tools: [{ type: 'function', function: { name: 'get_weather', parameters: WEATHER, parse: JSON.parse,
                                          function: (args) => { ran.push(args); return 'Sunny, 21 C'; } } }],
});
await runner.done();
out.run_tools_calls = ran;

// a structured output, parsed by the stream helper
const format = makeParseableResponseFormat(
  { type: 'json_schema', json_schema: { name: 'city', schema: WEATHER, strict: true } }, (text) => JSON.parse(text));
const structured = client.chat.completions.stream({
  model, messages: [{ role: 'user', content: 'Name a city as JSON.' }], response_format: format, max_tokens: 40, temperature: 0 });
out.structured = (await structured.finalChatCompletion()).choices[0].message.parsed;

// responses.stream(): the function call item of the final Response
const rstream = client.responses.stream({
  model, input: 'What is the weather in Paris?', max_output_tokens: 60, temperature: 0, tool_choice: 'required',
  tools: [{ type: 'function', name: 'get_weather', description: 'Current weather in a city', parameters: WEATHER, strict: true }],
});
const final = await rstream.finalResponse();
out.responses_calls = final.output.filter((o) => o.type === 'function_call').map((o) => ({ name: o.name, arguments: o.arguments }));

console.log(JSON.stringify(out));
