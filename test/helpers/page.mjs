// Preloaded (node --import) by test/doc-examples.test.ts into a process
// that runs a snippet of the documentation written for a web page: what it
// finds there, in Node. Relative URLs resolve against the page's origin
// (PAGE_ORIGIN), as in a page of the service; EventSource and localStorage;
// the page's token (PAGE_TOKEN); and the page's own functions (render,
// refetchSoon), which print what they get, one line of JSON each, as do an
// EventSource's opening and localStorage's writes.
import { EventSource as NodeEventSource } from 'eventsource'

const origin = process.env.PAGE_ORIGIN
const absolute = (url) => new URL(String(url), origin).href
const say = (name, value) => console.log(JSON.stringify({ [name]: value }))

const nodeFetch = globalThis.fetch
globalThis.fetch = (input, init) => nodeFetch(input instanceof Request ? input : absolute(input), init)

globalThis.EventSource = class PageEventSource extends NodeEventSource {
  constructor (url, init) {
    super(absolute(url), init)
    this.addEventListener('open', () => say('open', this.url))
  }
}

const stored = new Map()
Object.defineProperty(globalThis, 'localStorage', {
  value: {
    getItem: (key) => stored.get(key) ?? null,
    setItem: (key, value) => {
      stored.set(key, String(value))
      say('localStorage', { [key]: String(value) })
    }
  }
})

globalThis.token = process.env.PAGE_TOKEN
globalThis.render = (value) => say('render', value)
globalThis.refetchSoon = () => say('refetchSoon', true)
