// csvsum: an htfaas function in JavaScript (componentize-js: a WASI preview 2 component).
//
// The guest contract (the same for every language): argv[1] is the input file, /input/<name>
// (read-only); the top-level files left in /output are stored; the environment is the manifest's
// env; no network; exit status 0 is success (a thrown error: 1), stdout/stderr go to the job's log.
//
// What it does: reads the input as a CSV whose first row is the header, and writes
// /output/<name>.sums.json: the number of rows and, per column, how many fields are numbers and
// their sum. A row with another number of fields than the header fails the job.
//
// StarlingMonkey has no `fs` module: files go through the wasi:filesystem imports.
import { getArguments } from 'wasi:cli/environment@0.2.12';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

function preopen(name) {
  const found = getDirectories().find(([, path]) => path === name);
  if (!found) throw new Error(`no ${name} directory`);
  return found[0];
}

function readText(dir, path) {
  const file = dir.openAt({}, path, {}, { read: true });
  const chunks = [];
  let offset = 0n;
  for (;;) {
    const [chunk, eof] = file.read(65536n, offset);
    chunks.push(chunk);
    offset += BigInt(chunk.length);
    if (eof || chunk.length === 0) break;
  }
  const all = new Uint8Array(Number(offset));
  let at = 0;
  for (const c of chunks) { all.set(c, at); at += c.length; }
  return new TextDecoder('utf-8', { fatal: true }).decode(all);
}

function writeText(dir, path, text) {
  const bytes = new TextEncoder().encode(text);
  const file = dir.openAt({}, path, { create: true, truncate: true }, { write: true });
  let offset = 0;
  while (offset < bytes.length) offset += Number(file.write(bytes.subarray(offset), BigInt(offset)));
}

export const run = {
  run() {
    try {
      const args = getArguments();
      if (args.length < 2 || !args[1].startsWith('/input/')) throw new Error('usage: csvsum /input/<file>');
      const name = args[1].slice('/input/'.length);
      const lines = readText(preopen('/input'), name).split(/\r?\n/).filter((l) => l.length > 0);
      const header = (lines.shift() ?? '').split(',');
      const columns = header.map((h) => ({ name: h, numbers: 0, sum: 0 }));
      lines.forEach((line, i) => {
        const fields = line.split(',');
        if (fields.length !== header.length) {
          throw new Error(`line ${i + 2}: ${fields.length} fields, the header has ${header.length}`);
        }
        fields.forEach((f, c) => {
          const x = Number(f);
          if (f.trim() !== '' && Number.isFinite(x)) { columns[c].numbers++; columns[c].sum += x; }
        });
      });
      writeText(preopen('/output'), `${name}.sums.json`, JSON.stringify({ file: name, rows: lines.length, columns }));
    } catch (e) {
      console.error(`csvsum: ${e && e.message ? e.message : e}`);
      throw e; // `run` returns its error: exit status 1
    }
  },
};
