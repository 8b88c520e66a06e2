// __NAME__: an htfaas function in JavaScript (built with `htfaas fn build`: componentize-js into a
// WASI preview 2 component; run with `htfaas fn run`).
//
// The guest contract (the same for every language):
// - argv[1] is the input file, /input/<name> (read-only); later arguments are the manifest's
//   args (`htfaas fn register --arg ...`);
// - every top-level regular file left in /output is stored in the function's output directory
//   under the same name; subdirectories and symbolic links are not stored;
// - the environment holds exactly the manifest's env; there is no network, no other file;
// - exit status 0 is success; anything else (a thrown error: 1) fails the job, and
//   stdout/stderr are kept in the job's log (`htfaas jobs log ID`).
//
// JavaScript specifics: the engine is StarlingMonkey (SpiderMonkey); there is no `fs` module, so
// files go through the wasi:filesystem imports below. Code at module level runs at BUILD time.
import { getArguments } from 'wasi:cli/environment@0.2.12';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

function preopen(name) {
  const found = getDirectories().find(([, path]) => path === name);
  if (!found) throw new Error(`no ${name} directory`);
  return found[0];
}

function readAll(dir, path) {
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
  return all;
}

function writeAll(dir, path, bytes) {
  const file = dir.openAt({}, path, { create: true, truncate: true }, { write: true });
  let offset = 0;
  while (offset < bytes.length) {
    offset += Number(file.write(bytes.subarray(offset), BigInt(offset)));
  }
}

export const run = {
  run() {
    try {
      const args = getArguments();
      if (args.length < 2 || !args[1].startsWith('/input/')) throw new Error('usage: __NAME__ /input/<file>');
      const name = args[1].slice('/input/'.length);
      const data = readAll(preopen('/input'), name);
      let lines = 0, words = 0, inWord = false;
      for (const b of data) {
        if (b === 10) lines++;
        const space = b === 32 || (b >= 9 && b <= 13);
        if (!space && !inWord) words++;
        inWord = !space;
      }
      const result = JSON.stringify({ file: name, bytes: data.length, lines, words });
      writeAll(preopen('/output'), `${name}.count.json`, new TextEncoder().encode(result));
      console.log(`__NAME__: ${lines} lines`);
    } catch (e) {
      console.error(`__NAME__: ${e && e.message ? e.message : e}`);
      throw e; // `run` returns its error: exit status 1
    }
  },
};
