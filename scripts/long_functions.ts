/**
 * The house rule "no function over 80 lines", checked: lists every function, method, constructor
 * or arrow function longer than the limit (counted from its first line to its last, comments and
 * blank lines included, nested functions counted in their parent) and exits 1 when there is one.
 *
 *   usage: deno run -A scripts/long_functions.ts [--max LINES] [FILE...]
 * Without files: the tracked TypeScript of the code the rule covers (cli.ts, mod.ts, cli/, lib/,
 * worker/, relay/); tests/ and bench/ are not covered, but can be listed by naming their files.
 * Output: one line per offender, `LINES<TAB>FILE:LINE<TAB>NAME`, longest first.
 */
import ts from "typescript";

const DEFAULT_MAX_LINES = 80;
const COVERED = ["cli.ts", "mod.ts", "cli/", "lib/", "worker/", "relay/"];

export interface LongFunction {
  file: string;
  /** 1-based line of the function's first line. */
  line: number;
  lines: number;
  name: string;
}

/** The functions of `text` (a TypeScript file named `file`) longer than `maxLines`. */
export function longFunctions(file: string, text: string, maxLines: number): LongFunction[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const found: LongFunction[] = [];
  const visit = (node: ts.Node) => {
    if (isFunction(node)) {
      const first = source.getLineAndCharacterOfPosition(node.getStart()).line;
      const last = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      const lines = last - first + 1;
      if (lines > maxLines) found.push({ file, line: first + 1, lines, name: nameOf(node) });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

function isFunction(node: ts.Node): node is ts.FunctionLikeDeclaration {
  return ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node) ||
    ts.isArrowFunction(node) || ts.isFunctionExpression(node) ||
    ts.isConstructorDeclaration(node) || ts.isGetAccessorDeclaration(node) ||
    ts.isSetAccessorDeclaration(node);
}

/** The function's own name, else the variable or property it is assigned to, else where it is passed. */
function nameOf(node: ts.FunctionLikeDeclaration): string {
  if (ts.isConstructorDeclaration(node)) return "constructor";
  if (node.name) return node.name.getText();
  const parent = node.parent;
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent)) {
    return parent.name.getText();
  }
  if (ts.isCallExpression(parent)) {
    return `<anonymous, passed to ${parent.expression.getText().split("\n")[0].slice(-40)}>`;
  }
  return "<anonymous>";
}

async function trackedFiles(): Promise<string[]> {
  const listed = await new Deno.Command("git", {
    args: ["ls-files", "-z", "--", "*.ts"],
    stdout: "piped",
  }).output();
  if (!listed.success) throw new Error("git ls-files failed: run this inside the repository");
  return new TextDecoder().decode(listed.stdout).split("\0").filter((file) =>
    COVERED.some((covered) => covered.endsWith("/") ? file.startsWith(covered) : file === covered)
  );
}

function parseArgs(args: string[]): { maxLines: number; files: string[] } {
  let maxLines = DEFAULT_MAX_LINES;
  const files: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--max") {
      maxLines = Number(args[++i]);
      if (!Number.isInteger(maxLines) || maxLines < 1) {
        throw new RangeError(`--max needs a positive whole number of lines, not "${args[i]}"`);
      }
    } else files.push(args[i]);
  }
  return { maxLines, files };
}

async function main(args: string[]): Promise<number> {
  const { maxLines, files } = parseArgs(args);
  const checked = files.length > 0 ? files : await trackedFiles();
  const found: LongFunction[] = [];
  for (const file of checked) {
    found.push(...longFunctions(file, await Deno.readTextFile(file), maxLines));
  }
  found.sort((a, b) => b.lines - a.lines);
  for (const each of found) console.log(`${each.lines}\t${each.file}:${each.line}\t${each.name}`);
  if (found.length > 0) {
    console.error(
      `long functions: ${found.length} function(s) over ${maxLines} lines in ${checked.length} file(s); split each into named steps`,
    );
    return 1;
  }
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
