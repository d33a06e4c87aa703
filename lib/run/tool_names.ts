/**
 * Tool names on the wire, normalised as the seeds' worker does (`normalize_tool_name` from the
 * Python orchestrator's `amelia.core.constants`, applied to every `tool_call` and `tool_result`):
 * the driver-specific names of Claude Code's tools map to the standard names every driver reports,
 * and any other name passes through unchanged. deepagents' own tools (`read_file`, `write_file`,
 * `edit_file`, `glob`, `grep`, `task`, `ls`, `execute`, `write_todos`) already carry their names.
 */

/** Claude Code's tool names → the standard names. */
export const TOOL_NAME_ALIASES: Readonly<Record<string, string>> = {
  Read: "read_file",
  Write: "write_file",
  Edit: "edit_file",
  NotebookEdit: "notebook_edit",
  Glob: "glob",
  Grep: "grep",
  Bash: "run_shell_command",
  Task: "task",
  TaskOutput: "task_output",
  TaskStop: "task_stop",
  EnterPlanMode: "enter_plan_mode",
  ExitPlanMode: "exit_plan_mode",
  AskUserQuestion: "ask_user_question",
  Skill: "skill",
  TaskCreate: "task_create",
  TaskGet: "task_get",
  TaskUpdate: "task_update",
  TaskList: "task_list",
  WebFetch: "web_fetch",
  WebSearch: "web_search",
};

/** The standard name for `raw`, or `raw` itself when it has no alias. */
export function normalizeToolName(raw: string): string {
  return Object.hasOwn(TOOL_NAME_ALIASES, raw) ? TOOL_NAME_ALIASES[raw] : raw;
}
