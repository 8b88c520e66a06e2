// A real OpenID provider for the identity tests: `oidc-provider` (the OpenID-certified Node.js
// library; installed by scripts/install-deps.sh into .tools/oidc), on a loopback port of its
// own choosing, printing `listening <issuer>` once it serves. Clients (client_credentials):
// each client's `sub` is its id; its groups come from CLIENT_GROUPS below. Access tokens are
// RS256 JWTs for the audience AUDIENCE (env, default https://htfaas.example), with the scopes
// asked for among `compute.create compute.read storage.read:/data`.
// A public client `htfaas-cli` may use the device login (RFC 8628): its confirmation pages are
// the provider's development interactions (any login and password), which a test drives in a
// headless browser; the login typed is the token's `sub`.
// Usage: OIDC_PROVIDER_MODULE=<path to node_modules/oidc-provider> node idp.mjs
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const modulePath = process.env.OIDC_PROVIDER_MODULE;
if (!modulePath) {
  console.error('OIDC_PROVIDER_MODULE must name the oidc-provider package directory');
  process.exit(2);
}
const { default: Provider } = await import(pathToFileURL(`${modulePath}/lib/index.js`).href);
const audience = process.env.AUDIENCE || 'https://htfaas.example';
const CLIENT_GROUPS = {
  'carol-cli': ['/desy/cms'],
  'carol-bot': ['/desy/cms'],
  'dave-cli': ['/desy/atlas'],
  'mallory-cli': ['/elsewhere'],
  'erin-cli': ['/desy/cms'],
};

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const oidc = new Provider(issuer, {
    clients: Object.keys(CLIENT_GROUPS).map((id) => ({
      client_id: id, client_secret: `${id}-secret`, grant_types: ['client_credentials'],
      redirect_uris: [], response_types: [],
    })).concat([{
      client_id: 'htfaas-cli', token_endpoint_auth_method: 'none',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code'], redirect_uris: [], response_types: [],
    }]),
    features: {
      devInteractions: { enabled: true },
      deviceFlow: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => audience,
        getResourceServerInfo: () => ({
          scope: 'compute.create compute.read storage.read:/data',
          audience,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        }),
      },
    },
    extraTokenClaims: async (ctx, token) => ({
      groups: CLIENT_GROUPS[token.accountId || token.clientId] || [], wlcg_ver: '1.0',
    }),
  });
  server.on('request', oidc.callback());
  console.log(`listening ${issuer}`);
});
