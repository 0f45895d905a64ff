// The oracle for kvdiff's tokenizer.json and chat-template code: transformers.js' tokenizers
// (@lenml/tokenizers) and template engine (@huggingface/jinja), installed by ci/install-deps.
//
//   node oracle.mjs NPM_DIR encode TOKENIZER_DIR CORPUS.json   -> [{"ids": [...], "text": "..."}]
//   node oracle.mjs NPM_DIR render CASES.json                  -> ["prompt" | {"error": "..."}]
//
// encode: ids with add_special_tokens, and those ids decoded with special tokens kept and no
// clean-up of spaces (kvdiff's decoding is lossless; clean_up_tokenization_spaces is not).
// render: each case {"template", "messages", "add_generation_prompt", "bos_token", "eos_token"}.
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const [npmDir, mode, ...rest] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(npmDir, "node_modules", p)).href);
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));

if (mode === "encode") {
  const [dir, corpusFile] = rest;
  const { TokenizerLoader } = await load("@lenml/tokenizers/dist/main.mjs");
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: readJson(path.join(dir, "tokenizer.json")),
    tokenizerConfig: readJson(path.join(dir, "tokenizer_config.json")),
  });
  const out = readJson(corpusFile).map((text) => {
    const ids = tok.encode(text, { add_special_tokens: true });
    const decoded = ids.length === 0 ? "" :
      tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    return { ids, text: decoded };
  });
  process.stdout.write(JSON.stringify(out));
} else if (mode === "render") {
  const { Template } = await load("@huggingface/jinja/dist/index.js");
  const out = readJson(rest[0]).map((c) => {
    try {
      return new Template(c.template).render({
        messages: c.messages, add_generation_prompt: c.add_generation_prompt,
        bos_token: c.bos_token, eos_token: c.eos_token,
      });
    } catch (e) {
      return { error: String(e.message ?? e) };
    }
  });
  process.stdout.write(JSON.stringify(out));
} else {
  console.error("usage: node oracle.mjs NPM_DIR (encode TOKENIZER_DIR CORPUS.json | render CASES.json)");
  process.exit(2);
}
