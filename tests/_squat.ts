/**
 * The agent's attempt on a host socket in the read-only mount (a spare relay's control socket, a
 * waiting wrapper's job socket), as a Deno script run in the sandbox with the directory in "$1"
 * and the seconds in "$2": as soon as the socket is there, over and over, a connection for each
 * of `lines` (wrong keys, garbage; an empty one says nothing and stays open). It prints how many
 * connections it made.
 */
export function squatScript(socket: string, lines: string[]): string {
  return `
const [dir, seconds] = Deno.args;
const path = dir + ${JSON.stringify(`/${socket}`)};
const held = [];
let made = 0;
const until = Date.now() + Number(seconds) * 1000;
while (Date.now() < until) {
  for (const line of ${JSON.stringify(lines)}) {
    try {
      const conn = await Deno.connect({ transport: "unix", path });
      made++;
      if (line) await conn.write(new TextEncoder().encode(line));
      held.push(conn);
    } catch {
      // Not there yet, or already gone.
    }
  }
  await new Promise((resolve) => setTimeout(resolve, 2));
}
console.log(made);
`;
}
