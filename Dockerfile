# The service image: TypeScript compiled in a build stage, production
# dependencies and dist/ only in the runtime stage, run as the node user.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY client/package.json ./client/
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY *.ts ./
COPY db ./db
COPY events ./events
COPY plugins ./plugins
COPY routes ./routes
COPY schemas ./schemas
COPY ui ./ui
COPY bin ./bin
COPY client ./client
# npm run build also packs the client package (npm run build:client: dist/ocp-api-client-<version>.tgz),
# which the service serves at /client/ocp-api-client.tgz for `npx -y <service>/client/ocp-api-client.tgz`.
RUN npm run build && npm prune --omit=dev

FROM node:24-bookworm-slim
ENV NODE_ENV=production PORT=8080 HOST=0.0.0.0
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/ui ./ui
# The ocp-api command (bin/ocp-api.js runs dist/client/src/ocp-api.js), on the PATH: `docker compose exec api ocp-api runs`.
# `npx ocp-api` works too: npx runs a bin of the package in the current directory by linking the
# package into its cache (~/.npm/_npx) and chmod-ing each bin of package.json, which only their
# owner may do. So the node user owns those two files (bin/ocp-api.js, dist/db/seed.js), and
# nothing else: the rest of /app stays root's, read-only to the service.
COPY --from=build --chown=node:node /app/bin ./bin
RUN chown node:node dist/db/seed.js && ln -s /app/bin/ocp-api.js /usr/local/bin/ocp-api
USER node
EXPOSE 8080
# Liveness; failing checks count after a 60 s start period (a busy host), as in docker-compose.yml.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + process.env.PORT + '/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# --max-semi-space-size=16: Node 24's V8 lets the young generation grow to 128 MB (two 64 MB
# semi-spaces, whatever the heap limit), which kept about 10 kB more resident memory per open
# event stream; 16 MB semi-spaces, Node 20's, keep a stream under 20 kB (docs/operating.md,
# "Memory"; BENCHMARKS.md). The same flag as package.json's start script. A flag here, not
# NODE_OPTIONS, so that it is the server's alone and an operator's NODE_OPTIONS cannot drop it;
# V8 reads it only at start, so the service cannot set it itself (to change it, override the command).
CMD ["node", "--max-semi-space-size=16", "dist/server.js"]
