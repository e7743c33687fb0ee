import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// A static build (dist/) that any file server can serve; `vite preview` is one.
export default defineConfig({
  plugins: [react()],
  base: "./",
  build: { outDir: "dist", emptyOutDir: true },
});
