import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { root } from './run.js'

/* The fenced code blocks of the documentation, for the tests that run them as written. */

export interface CodeBlock {
  /** The Markdown file, relative to the repository's root. */
  file: string
  /** The heading the block is under, as written (`### In CI`); '' before the first. */
  heading: string
  /** The block's language (`sh`, `ts`), '' when it names none. */
  language: string
  code: string
}

/** The fenced code blocks of `file` (relative to the repository's root), indented ones (in a list item) included, in order. */
export function codeBlocks (file: string): CodeBlock[] {
  const text = readFileSync(join(root, file), 'utf8')
  const blocks: CodeBlock[] = []
  let heading = ''
  for (const match of text.matchAll(/^(#{1,6} .*)$|^( *)```(\w*)\n([^]*?)^\2```$/gm)) {
    if (match[1] !== undefined) {
      heading = match[1]
      continue
    }
    const indent = match[2]!
    const code = match[4]!.split('\n').map((line) => line.startsWith(indent) ? line.slice(indent.length) : line).join('\n')
    blocks.push({ file, heading, language: match[3]!, code })
  }
  return blocks
}
