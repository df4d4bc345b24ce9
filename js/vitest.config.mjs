import { defineConfig } from "vitest/config";

// Pure modules run under node; test/render.test.js opts into jsdom with a file comment.
export default defineConfig({
  test: {
    include: ["test/**/*.test.js"],
    environment: "node",
  },
});
