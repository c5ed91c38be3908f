// A real OAuth 2.1 authorization server for the router's tests: oidc-provider (pinned in
// package-lock.json) on 127.0.0.1, everything in memory, nothing here is fit for production.
//
//   node tests/idp/server.mjs --port 0 --resource http://127.0.0.1:8080/mcp \
//        --client svc:s3cret:ES256 --scopes "mcp:tools files:read" --user alice
//
// When it accepts connections it prints ONE JSON line on stdout:
//   {"issuer":"http://127.0.0.1:PORT","port":PORT,"kids":[the signing keys' kids]}
// It exits when its stdin closes (so a test process that dies never leaves it behind) and on
// SIGTERM/SIGINT. oidc-provider's own notices go to stderr.
//
// Options (each also read from the env var in brackets when the flag is absent):
//   --port N           listen port, 0 picks a free one                       [MRTR_IDP_PORT]
//   --resource URL     a resource (RFC 8707) it mints tokens for; repeat it   [MRTR_IDP_RESOURCES, space-separated]
//                      for several. Any other resource is refused with the library's invalid_target.
//   --client ID:SECRET[:ALG]  a pre-registered client_credentials client (client_secret_basic
//                      or _post); ALG (ES256|RS256) signs its tokens; repeat   [MRTR_IDP_CLIENTS, space-separated]
//   --scopes "a b"     the scopes every resource offers; a token gets those requested
//                      [MRTR_IDP_SCOPES; default "mcp:tools mcp:tools:call files:read files:write tasks"]
//   --alg ES256|RS256  signs tokens of clients without their own ALG (dynamically registered ones)
//                      [MRTR_IDP_ALG; default ES256]
//   --user NAME        the end-user the scripted login signs in when the authorization request
//                      has no login_hint                                     [MRTR_IDP_USER; default alice]
//   --ttl SECONDS      access token lifetime                                  [MRTR_IDP_TTL; default 300]
//
// Grants: client_credentials; authorization_code with PKCE (S256, required for every client)
// and refresh_token. The login and consent interaction is scripted: GET /interaction/<uid>
// signs in login_hint (or --user) and grants what was asked, so a client that follows
// redirects (and keeps cookies, as a browser does) arrives at its redirect_uri with a code.
// Access tokens are JWTs (typ at+jwt) whose aud is the requested resource.
//
// Test-only endpoints:
//   POST /test/rotate[?retire=1]  makes a new ES256 and a new RS256 key (new kids) that sign from
//     then on; the old keys stay in the JWKS unless retire=1 drops them. It answers
//     {"kids":{"ES256":..,"RS256":..},"published":[every kid in the JWKS]}.
//   POST /test/resource?url=URL   adds a resource it mints tokens for (like --resource), for
//     one whose URL is known only after this server started; answers {"resources":[...]}.
// The AS metadata is served at /.well-known/oauth-authorization-server (RFC 8414) and at
// /.well-known/openid-configuration: the same document.

import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { errors } from 'oidc-provider';

const ALGS = ['ES256', 'RS256'];

// stdout carries the ready line only; the library prints its notices with console.info.
console.info = console.error;

function options() {
  const { values } = parseArgs({
    options: {
      port: { type: 'string' },
      resource: { type: 'string', multiple: true },
      client: { type: 'string', multiple: true },
      scopes: { type: 'string' },
      alg: { type: 'string' },
      user: { type: 'string' },
      ttl: { type: 'string' },
    },
  });
  const env = process.env;
  const list = (flag, name) => flag ?? (env[name] ? env[name].split(/\s+/).filter(Boolean) : []);
  const opts = {
    port: Number(values.port ?? env.MRTR_IDP_PORT ?? 0),
    resources: list(values.resource, 'MRTR_IDP_RESOURCES'),
    clients: list(values.client, 'MRTR_IDP_CLIENTS').map((spec) => {
      const [id, secret, alg] = spec.split(':');
      if (!id || !secret) throw new Error(`--client wants ID:SECRET[:ALG], got ${spec}`);
      return { id, secret, alg };
    }),
    scopes: (values.scopes ?? env.MRTR_IDP_SCOPES
      ?? 'mcp:tools mcp:tools:call files:read files:write tasks').split(/\s+/).filter(Boolean),
    alg: values.alg ?? env.MRTR_IDP_ALG ?? 'ES256',
    user: values.user ?? env.MRTR_IDP_USER ?? 'alice',
    ttl: Number(values.ttl ?? env.MRTR_IDP_TTL ?? 300),
  };
  for (const alg of [opts.alg, ...opts.clients.map((c) => c.alg).filter(Boolean)]) {
    if (!ALGS.includes(alg)) throw new Error(`unsupported alg ${alg}: one of ${ALGS}`);
  }
  if (!Number.isInteger(opts.port) || !(opts.ttl > 0)) throw new Error('bad --port or --ttl');
  return opts;
}

// A private signing JWK of `alg` with a fresh kid; oidc-provider publishes its public half.
function signingKey(alg) {
  const { privateKey } = alg === 'ES256'
    ? generateKeyPairSync('ec', { namedCurve: 'P-256' })
    : generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: `${alg.toLowerCase()}-${randomUUID()}`, alg, use: 'sig' };
}

// The provider's keystore is fixed at construction, so a rotation builds a new Provider over
// the same state: the memory adapter's store is module-wide (clients registered, grants,
// sessions and codes survive) and the cookie keys are constant.
function buildProvider(issuer, opts, keys) {
  const algOf = new Map(opts.clients.map((c) => [c.id, c.alg ?? opts.alg]));
  const offered = ['openid', 'offline_access', ...opts.scopes];
  const provider = new Provider(issuer, {
    // Newest keys first: for each alg the first key in the set is the one that signs.
    jwks: { keys },
    clients: opts.clients.map((c) => ({
      client_id: c.id,
      client_secret: c.secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
    // A pre-registered client may authenticate either way; the SDK's default is basic.
    clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'none'],
    cookies: { keys: ['mrtr-test-idp-cookies-are-test-only'] },
    findAccount: (_ctx, sub) => ({ accountId: sub, claims: () => ({ sub }) }),
    // Advertised in scopes_supported; what a token carries is decided per resource below.
    scopes: offered,
    // The MCP SDK registers with the scope of its first challenge and steps up past it later,
    // but the library holds a client to the scope it registered (RFC 7591 allows either): so
    // a registered client's scope is widened to everything offered. The hook is the only one
    // that sees a registration's metadata; its property itself is unused.
    extraClientMetadata: {
      properties: ['mrtr_test_scope'],
      validator: (ctx, _key, _value, metadata) => {
        if (ctx) metadata.scope = offered.join(' ');
      },
    },
    // A refresh token for every client registered for that grant, offline_access or not
    // (the library's default wants an OpenID Connect request for it).
    issueRefreshToken: (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    pkce: { required: () => true },
    responseTypes: ['code'],
    // Every artifact's lifetime set (the library notices each default it uses): an hour
    // outlives any test.
    ttl: {
      AccessToken: opts.ttl,
      ClientCredentials: opts.ttl,
      AuthorizationCode: 60,
      IdToken: 3600,
      RefreshToken: 3600,
      Interaction: 3600,
      Session: 3600,
      Grant: 3600,
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      registration: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // The code or refresh token's single granted resource serves when the token request
        // names none.
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource, client) => {
          if (!opts.resources.includes(resource)) throw new errors.InvalidTarget();
          return {
            scope: opts.scopes.join(' '),
            accessTokenFormat: 'jwt',
            accessTokenTTL: opts.ttl,
            jwt: { sign: { alg: algOf.get(client.clientId) ?? opts.alg } },
          };
        },
      },
    },
  });
  provider.on('server_error', (_ctx, err) => console.error('idp: server_error', err));
  return provider;
}

// The scripted interaction: log in the hinted (or default) user, then consent to exactly what
// the request asked for.
async function interact(provider, opts, req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session } = details;
  if (prompt.name === 'login') {
    const accountId = params.login_hint || opts.user;
    return provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
  }
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  const missing = prompt.details;
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
    grant.addResourceScope(resource, scopes.join(' '));
  }
  const grantId = await grant.save();
  return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

function json(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

async function main() {
  const opts = options();
  let keys = ALGS.map(signingKey);
  let provider;
  let handle;

  const server = createServer((req, res) => {
    const url = new URL(req.url, 'http://idp');
    if (req.method === 'POST' && url.pathname === '/test/rotate') {
      const fresh = ALGS.map(signingKey);
      keys = url.searchParams.get('retire') === '1' ? fresh : [...fresh, ...keys];
      provider = buildProvider(provider.issuer, opts, keys);
      handle = provider.callback();
      return json(res, 200, {
        kids: Object.fromEntries(fresh.map((k) => [k.alg, k.kid])),
        published: keys.map((k) => k.kid),
      });
    }
    if (req.method === 'POST' && url.pathname === '/test/resource') {
      // A resource known only once it listens (a router on port 0) is added here.
      const resource = url.searchParams.get('url');
      if (!resource || !URL.canParse(resource)) return json(res, 400, { error: 'want ?url=<absolute URL>' });
      if (!opts.resources.includes(resource)) opts.resources.push(resource);
      return json(res, 200, { resources: opts.resources });
    }
    if (req.method === 'GET' && url.pathname.startsWith('/interaction/')) {
      return interact(provider, opts, req, res).catch((err) => {
        console.error('idp: interaction failed:', err);
        if (!res.headersSent) json(res, 500, { error: 'server_error', error_description: String(err) });
      });
    }
    if (url.pathname === '/.well-known/oauth-authorization-server') {
      req.url = '/.well-known/openid-configuration';
    }
    return handle(req, res);
  });

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  provider = buildProvider(issuer, opts, keys);
  handle = provider.callback();

  const stop = () => {
    server.close();
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();

  // Endpoints are left to discovery (the metadata document), as a real client finds them.
  process.stdout.write(`${JSON.stringify({ issuer, port, kids: keys.map((k) => k.kid) })}\n`);
}

main().catch((err) => {
  console.error('idp: failed to start:', err);
  process.exit(1);
});
