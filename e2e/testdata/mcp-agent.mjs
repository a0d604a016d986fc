// A scripted agent on the official TypeScript MCP SDK: it launches
// fleet-mcp (the command and arguments it is given) over stdio, works the
// queue until there is nothing to do, and prints what it saw as one JSON
// line. The SDK's client checks each tool's structured answer against the
// tool's output schema.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const client = new Client({ name: "fleet-ts-agent", version: "0" });
await client.connect(new StdioClientTransport({ command, args, stderr: "inherit" }));

const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const prompt = await client.getPrompt({ name: "fleet_worker" });
const results = [];
for (let polls = 0; polls < 600; polls++) {
  const take = await client.callTool({ name: "take_job", arguments: {} });
  if (take.isError) throw new Error("take_job: " + JSON.stringify(take.content));
  const taken = take.structuredContent;
  if (taken.status === "nothing_to_do") break;
  if (taken.status === "denied") { // refused with its claim: not held
    results.push({ section: taken.job.section, error: "denied: " + taken.admission.reason });
    continue;
  }
  if (taken.status !== "claimed") {
    await new Promise((resolve) => setTimeout(resolve, 100));
    continue;
  }
  const begin = await client.callTool({ name: "begin_work", arguments: {} });
  if (begin.isError) {
    results.push({ section: taken.job.section, error: begin.content[0].text });
    continue;
  }
  const text = `The TypeScript agent's ${taken.job.section}.`;
  const pub = await client.callTool({ name: "publish_section", arguments: { text, model: "ts-agent" } });
  if (pub.isError) throw new Error("publish_section: " + JSON.stringify(pub.content));
  results.push({ section: taken.job.section, operation_id: taken.job.operation_id, ...pub.structuredContent });
}
console.log(JSON.stringify({ tools, prompt: prompt.messages[0].content.text, results }));
await client.close();
