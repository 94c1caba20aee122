/** One Server-Sent Events block: the fields this API sends (`id`, `data`, `retry`). */
export interface SseBlock {
  id?: string
  data?: string
  retry?: number
  /** The block's last comment line, without the colon: the service says there why it ends a stream it refused. */
  comment?: string
}

/**
 * The blocks of a text/event-stream body, as the HTML standard parses them
 * (lines end in LF, CRLF or CR; `:` starts a comment; data lines join with
 * LF). Blocks with no field (comments alone, keep-alives) are skipped.
 */
export async function * readSse (body: ReadableStream<Uint8Array>): AsyncGenerator<SseBlock> {
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let buffer = ''
  let block: SseBlock = {}
  let data: string[] = []
  try {
    while (true) {
      const { done, value } = await reader.read()
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true })
      // A CR at the very end may be the first half of a CRLF: keep it until more arrives.
      const lines = buffer.split(/\r\n|\r(?!$)|\n/)
      buffer = done ? '' : lines.pop()!
      for (const line of lines) {
        if (line === '') {
          if (data.length > 0) block.data = data.join('\n')
          if (Object.keys(block).some((field) => field !== 'comment')) yield block
          block = {}
          data = []
          continue
        }
        if (line.startsWith(':')) {
          block.comment = line.slice(1).trim()
          continue
        }
        const colon = line.indexOf(':')
        const field = colon === -1 ? line : line.slice(0, colon)
        const value = colon === -1 ? '' : line.slice(line[colon + 1] === ' ' ? colon + 2 : colon + 1)
        if (field === 'data') data.push(value)
        else if (field === 'id' && !value.includes('\u0000')) block.id = value
        else if (field === 'retry' && /^\d+$/.test(value)) block.retry = Number(value)
      }
      if (done) return
    }
  } finally {
    await reader.cancel().catch(() => {})
  }
}
