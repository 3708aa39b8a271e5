"""An agent that answers new mail on masd's slave-role cases over MCP (docs/agents.md).

    python docs/agent.py --config /etc/masd/masd.toml --token-file /etc/masd/crm.token

It runs `masd mcp` as its MCP server, waits for mail on its cases, reads each new one,
drafts an answer and sends it from the case's address.  `draft()` is where a language
model goes; this one writes a polite template.
"""

import argparse
import asyncio
import json

from mcp import ClientSession, StdioServerParameters, stdio_client


def draft(message: dict) -> str:
    event = message["event"]
    asked = (event.get("reply_text") or event.get("text") or "").strip()
    first = asked.splitlines()[0] if asked else "your message"
    return f"Hello,\n\nThank you for writing about: {first}\nWe are on it.\n\nThe support team\n"


async def tool(client: ClientSession, name: str, **args: object) -> dict:
    result = await client.call_tool(name, args)
    answer = json.loads(result.content[0].text)
    if result.is_error:  # a named refusal: {"ok": false, "error": CODE, "detail": ...}
        raise RuntimeError(f"{name}: {answer['error']}: {answer['detail']}")
    return answer


async def work(masd: str, config: str, token_file: str, answers: int) -> None:
    server = StdioServerParameters(
        command=masd, args=["mcp", "--config", config, "--token-file", token_file]
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        after = None
        while answers > 0:
            page = await tool(client, "wait_events", **({"after": after} if after else {}), wait=30)
            after = page["next"]
            for event in page["events"]:
                entry = event["entry"]
                if entry["kind"] != "mail.in" or answers == 0:
                    continue
                message = (await tool(client, "read_message", message_ref=entry["message_ref"]))
                sent = await tool(
                    client,
                    "send_mail",
                    case=event["case"],
                    in_reply_to=entry["message_ref"],
                    body=draft(message["message"]),
                )
                print(f"answered {entry['message_ref']} on {event['case']['key']}: {sent}")
                answers -= 1


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--masd", default="masd", help="the masd command")
    cli.add_argument("--config", required=True)
    cli.add_argument("--token-file", required=True)
    cli.add_argument("--answers", type=int, default=1, help="stop after this many")
    opts = cli.parse_args()
    asyncio.run(work(opts.masd, opts.config, opts.token_file, opts.answers))
