/** Where a repository's object cache is, inside the sandboxes that mount it (lib/repo/cache.ts). */
export const CACHE_DIR = "/cache";
/** The cache's bare repository, and its objects (what a run's checkout borrows). */
export const CACHE_REPO = `${CACHE_DIR}/repo.git`;
export const CACHE_OBJECTS = `${CACHE_REPO}/objects`;
