// Parse an AsyncAPI document with the AsyncAPI project's parser; print each diagnostic as a JSON
// line; exit 1 when the document does not parse or has an error (severity 0).
import { Parser } from '@asyncapi/parser';
import { readFileSync } from 'node:fs';

const { document, diagnostics } = await new Parser().parse(readFileSync(process.argv[2], 'utf8'));
for (const d of diagnostics) {
  console.log(JSON.stringify({ severity: d.severity, code: d.code, message: d.message, path: d.path }));
}
process.exit(document && !diagnostics.some((d) => d.severity === 0) ? 0 : 1);
