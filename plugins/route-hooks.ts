/**
 * A route's hooks of one kind with one more at the end, for an onRoute
 * hook that gives a route a hook of its own: Fastify leaves the option
 * unset, a function or a list, whichever the route was declared with.
 */
export function withRouteHook<Hook> (declared: Hook | Hook[] | undefined, hook: Hook): Hook[] {
  return [declared, hook].flat().filter((each): each is Hook => each !== undefined)
}
