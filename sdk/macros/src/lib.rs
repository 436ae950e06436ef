//! Attribute macros of `floe-sdk`: `#[filter]`, `#[map]` and `#[flat_map]` turn one
//! function into a Floe transform plugin. Use them through `floe-sdk`, whose docs
//! describe them.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::quote;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Type};

/// `#[filter] fn name(record: &Record [, config: &C]) -> bool`: `true` keeps the record
/// unchanged, `false` drops it. See `floe_sdk`.
#[proc_macro_attribute]
pub fn filter(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand("filter", attr, item)
}

/// `#[map] fn name(record: &Record [, config: &C]) -> Answer` (or a `Patch`, an `Emit`,
/// an `Option` or a `Result` of those). See `floe_sdk`.
#[proc_macro_attribute]
pub fn map(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand("map", attr, item)
}

/// `#[flat_map] fn name(record: &Record [, config: &C]) -> Vec<Emit>`: the record is
/// replaced by the outputs. See `floe_sdk`.
#[proc_macro_attribute]
pub fn flat_map(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand("flat_map", attr, item)
}

fn expand(shape: &str, attr: TokenStream, item: TokenStream) -> TokenStream {
    match try_expand(shape, attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn try_expand(
    shape: &str,
    attr: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let plugin: Ident = if attr.is_empty() {
        Ident::new("Plugin", Span::call_site())
    } else {
        syn::parse2(attr).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("#[{shape}] takes nothing, or the name of the plugin type to define: #[{shape}(MyPlugin)]"),
            )
        })?
    };
    let function: ItemFn = syn::parse2(item)?;
    let sig = &function.sig;
    if sig.asyncness.is_some() || !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.span(),
            format!("#[{shape}] needs a plain function: fn(record: &Record [, config: &Config])"),
        ));
    }
    let name = &sig.ident;
    let vis = &function.vis;
    let mut args = sig.inputs.iter();
    let usage = || {
        syn::Error::new(
            sig.inputs.span(),
            format!(
                "#[{shape}]: the function takes the record, and optionally the config: fn {name}(record: &Record, config: &Config)"
            ),
        )
    };
    match args.next() {
        Some(FnArg::Typed(_)) => {}
        _ => return Err(usage()),
    }
    let config = match args.next() {
        None => None,
        Some(FnArg::Typed(arg)) => match &*arg.ty {
            Type::Reference(r) => Some((r.elem.clone(), r.mutability.is_some())),
            _ => {
                return Err(syn::Error::new(
                    arg.ty.span(),
                    format!(
                        "#[{shape}]: the config parameter must be a reference, `&Config` or `&mut Config`"
                    ),
                ));
            }
        },
        Some(other) => return Err(syn::Error::new(other.span(), "unexpected `self`")),
    };
    if args.next().is_some() {
        return Err(usage());
    }
    let answer = Ident::new(shape, Span::call_site());
    let doc = format!(
        "The plugin made of the function [`{name}`] (`#[{shape}]`); `floe_sdk::testing::Harness::<{plugin}>` runs it in tests."
    );
    let (definition, config_type, new_body, call) = match config {
        None => (
            quote! { #vis struct #plugin; },
            quote! { ::floe_sdk::NoConfig },
            quote! { let _ = config; ::std::result::Result::Ok(#plugin) },
            quote! { #name(record) },
        ),
        Some((ty, mutable)) => {
            let reference = if mutable {
                quote! { &mut self.0 }
            } else {
                quote! { &self.0 }
            };
            (
                quote! { #vis struct #plugin(#ty); },
                quote! { #ty },
                quote! { ::std::result::Result::Ok(#plugin(config)) },
                quote! { #name(record, #reference) },
            )
        }
    };
    Ok(quote! {
        #[allow(dead_code, reason = "called by the plugin's WebAssembly exports")]
        #function

        #[doc = #doc]
        #[allow(dead_code, reason = "used by the plugin's WebAssembly exports")]
        #definition

        impl ::floe_sdk::Transform for #plugin {
            type Config = #config_type;

            fn new(config: Self::Config) -> ::std::result::Result<Self, ::floe_sdk::Error> {
                #new_body
            }

            fn process(
                &mut self,
                record: &::floe_sdk::Record<'_>,
            ) -> ::std::result::Result<::floe_sdk::Answer, ::floe_sdk::Error> {
                ::floe_sdk::__export::macros::#answer(#call)
            }
        }

        ::floe_sdk::export!(#plugin);
    })
}
