"""llama.cpp pre-tokenizer names (``tokenizer.ggml.pre``) keyed by the sha256 of a BPE tokenizer's
encoding of :data:`CHECK_TEXT`, as llama.cpp's converter computes them (``convert_hf_to_gguf.py``,
``TextModel.get_vocab_base_pre``: ``sha256(str(tokenizer.encode(CHECK_TEXT)))``).

Generated from ``conversion/base.py`` of the llama.cpp vendored in llama-cpp-python 0.3.36 (MIT
license); the comment after each hash names the model it was computed from. Every name is one that
release's BPE vocabulary loader accepts (``src/llama-vocab.cpp``, ``llama_vocab::impl::load``); the
two BERT WordPiece entries (bert-bge*), which that loader does not read, are left out.
"""

CHECK_TEXT = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"

PRE_BY_HASH: dict[str, str] = {
    "b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b": "chatglm-bpe",  # THUDM/glm-4-9b-chat
    "81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516": "chatglm-bpe",  # THUDM/glm-4-9b-chat
    "a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2": "glm4",  # THUDM/glm-4-9b-hf
    "9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902": "glm4",  # zai-org/GLM-4.5-Air
    "cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267": "glm4",  # zai-org/GLM-4.7-Flash
    "1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35": "minerva-7b",  # sapienzanlp/Minerva-7B-base-v1.0
    "7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664": "hunyuan",  # tencent/Hunyuan-A13B-Instruct
    "bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6": "hunyuan-dense",  # tencent/Hunyuan-4B-Instruct
    "e6ddf9c6686791c12d698d34c31ab9be1fea9af5a3d9a6909783ab382198ae1c": "hy_v4",  # tencent/Hy4-preview
    "a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6": "falcon-h1",  # tiiuae/Falcon-H1-0.5B-Base
    "60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86": "falcon-h1",  # tiiuae/Falcon-H1-1B-Base
    "3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896": "falcon-h1",  # tiiuae/Falcon-H1-7B-Base
    "48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b": "falcon-h1",  # tiiuae/Falcon-H1-34B-Base
    "81212dc7cdb7e0c1074ca62c5aeab0d43c9f52b8a737be7b12a777c953027890": "kimi-k2",  # moonshotai/Kimi-K2-Base
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f": "qwen35",  # openbmb/MiniCPM-V-4_6
    "66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273": "grok-2",  # alvarobartt/grok-2-tokenizer
    "b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df": "jina-v2-de",  # aari1995/German_Semantic_V3
    "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4": "gpt-2",  # evilfreelancer/ruGPT3XL
    "9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7": "lfm2",  # LiquidAI/LFM2.5-8B-A1B
    "846deafc5b0fa786186fa4ae6c7b49903cf2f1d1895bdb80b9120d60be135252": "gemma4",  # danish-foundation-models/DFM-Mimir
    "0a766d034107bc736a3f2dc4968fd62e54a3570f1454443e0c5a4cc6bd7941ed": "spark2_5",  # XHToken/Spark-X2.5-1.7B
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",  # deepseek-ai/deepseek-llm-7b-base
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",  # deepseek-ai/deepseek-coder-6.7b-base
    "8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed": "falcon",  # tiiuae/falcon-7b
    "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e": "falcon3",  # tiiuae/Falcon3-7B-Base
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "mpt",  # mosaicml/mpt-7b
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",  # bigcode/starcoder2-3b
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3": "stablelm2",  # stabilityai/stablelm-2-zephyr-1_6b
    "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff": "refact",  # smallcloudai/Refact-1_6-base
    "9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8": "command-r",  # CohereForAI/c4ai-command-r-v01
    "d772b220ace2baec124bed8cfafce0ead7d6c38a4b65ef11261cf9d5d62246d1": "tiny_aya",  # CohereLabs/tiny-aya-base
    "52df12b4c8d4176e7481aab4b6e8454d1fd0a210a04a574f6d4e067d10e23c3e": "cohere2moe",  # CohereLabs/North-Mini-Code-1.0
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e": "dbrx",  # databricks/dbrx-base
    "c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448": "jina-v1-en",  # jinaai/jina-reranker-v1-tiny-en
    "171aeeedd6fb548d418a7461d053f11b6f1f1fc9b387bd66640d28a4b9f5c643": "jina-v2-es",  # jinaai/jina-embeddings-v2-base-es
    "27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6": "jina-v2-de",  # jinaai/jina-embeddings-v2-base-de
    "a023e9fdc5a11f034d3ef515b92350e56fb2af1f66c6b6811a4444ea9bf8763d": "jina-v5-nano",  # jinaai/jina-embeddings-v5-text-nano
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",  # abacusai/Smaug-Llama-3-70B-Instruct
    "c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360": "poro-chat",  # LumiOpen/Poro-34B-chat
    "7967bfa498ade6b757b064f31e964dddbb80f8f9a4d68d4ba7998fcf281c531a": "jina-v2-code",  # jinaai/jina-embeddings-v2-base-code
    "7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee": "viking",  # LumiOpen/Viking-7B
    "b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901": "jais",  # core42/jais-13b
    "bc5108ee1eb6a3d600cadd065f63190fbd0554dbc9e4bbd6a0d977970afc8d2a": "jais-2",  # inceptionai/Jais-2-8B-Chat
    "7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f": "codeshell",  # WisdomShell/CodeShell-7B
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # mistralai/Mistral-Nemo-Base-2407
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7": "bloom",  # bigscience/bloom
    "bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21": "gpt3-finnish",  # TurkuNLP/gpt3-finnish-small
    "4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae": "exaone",  # LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": "phi-2",  # microsoft/phi-2
    "60824e3c0d9401f89943cbb2fff727f0e2d4c545ba4df2d6e4f09a6db0f5b450": "chameleon",  # facebook/chameleon-7b
    "8b5a93ed704057481f240da0be7e7dca721d7f8f4755263b6807227a2cbeae65": "roberta-bpe",  # sentence-transformers/stsb-roberta-base
    "ad851be1dba641f2e3711822f816db2c265f788b37c63b4e1aeacb9ee92de8eb": "gigachat",  # ai-sage/GigaChat-20B-A3B-instruct
    "d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1": "megrez",  # Infinigence/Megrez-3B-Instruct
    "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5": "deepseek-v3",  # deepseek-ai/DeepSeek-V3
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",  # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",  # Xenova/gpt-4o
    "7dec86086fcc38b66b7bc1575a160ae21cf705be7718b9d5598190d7c12db76f": "superbpe",  # UW/OLMo2-8B-SuperBPE-t180k
    "1994ffd01900cfb37395608534236ecd63f2bd5995d6cb1004dda1af50240f15": "trillion",  # trillionlabs/Trillion-7B-preview
    "96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224": "bailingmoe",  # inclusionAI/Ling-lite
    "d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406": "llama4",  # meta-llama/Llama-4-Scout-17B-16E-Instruct
    "0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3": "pixtral",  # mistral-community/pixtral-12b
    "d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec": "seed-coder",  # ByteDance-Seed/Seed-Coder-8B-Base
    "b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf": "a.x-4.0",  # skt/A.X-4.0
    "f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4": "midm-2.0",  # K-intelligence/Midm-2.0-Base-Instruct
    "169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51": "lfm2",  # LiquidAI/LFM2.5-350M
    "2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb": "exaone4",  # LGAI-EXAONE/EXAONE-4.0-32B
    "a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756": "mellum",  # JetBrains/Mellum-4b-base
    "a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152": "modern-bert",  # answerdotai/ModernBERT-base
    "49fc0303c9e0d2c2c565c510f64b2d9b271276acdcdadff733249eda9f7d59df": "afmoe",  # arcee-ai/Trinity-Tokenizer
    "9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206": "bailingmoe2",  # inclusionAI/Ling-mini-base-2.0
    "53e325976a6e142379c19b09afcae354f2f496f147afa8f9e189a33fe4e3024e": "granite-docling",  # ibm-granite/granite-docling-258M
    "f4f37b6c8eb9ea29b3eac6bb8c8487c5ab7885f8d8022e67edc1c68ce8403e95": "minimax-m2",  # MiniMaxAI/MiniMax-M2
    "4a2e2abae11ca2b86d570fc5b44be4d5eb5e72cc8f22dd136a94b37da83ab665": "kormo",  # KORMo-Team/KORMo-tokenizer
    "9d70134b369a70e5735009b6de918f7581b5211f7c074d1f89f753aea8248af1": "youtu",  # tencent/Youtu-LLM-2B
    "16389f0a1f51ee53e562ffd51c371dc508639ab0e4261502071836e50e223e91": "solar-open",  # upstage/Solar-Open-100B
    "6c81ce329e0802883b22eabab0d3fa48357337ef1ecb45443828bf1f6254833f": "exaone-moe",  # LGAI-EXAONE/K-EXAONE-236B-A23B
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4": "qwen35",  # Qwen/Qwen3.5-9B-Instruct
    "b4b8ca1f9769494fbd956ebc4c249de6131fb277a4a3345a7a92c7dd7a55808d": "joyai-llm",  # jdopensource/JoyAI-LLM-Flash
    "e4d54df1ebc1f2b91acd986c5b51aa50837d5faf7c7398e73c1f9e9ee5d19869": "kanana2",  # kakaocorp/kanana-2-30b-a3b-instruct-2601
    "862f827721df956049dff5ca81a57f29e575280bc622e290d3bf4e35eca29015": "f2llmv2",  # codefuse-ai/F2LLM-v2-4B
    "62f6fb0a6fd5098caeabb19b07a5c1099cafc8b9c40eab6ea89ece4ec02fbc57": "sarvam-moe",  # sarvamai/sarvam-30b
    "f728162c1315c26e40249849799b4ba3fe584c32084b4795b03eb295e63cb5af": "talkie",  # lewtun/talkie-1930-13b-it-hf
    "36f3066e97b7f3994b379aaacde306c1444c6ae84e81a5ae3cd2b7ed3b8c42d4": "minicpm5",  # openbmb/MiniCPM5-1B
    "f241072145675bf8322086f115aebad05e9f869557a238bf2150a2a417d1bf60": "granite-embed-multi-97m",  # ibm-granite/granite-embedding-97m-multilingual-r2
    "789696f5946cc0fc59371f39f6097cafed196b3acded6140432f26bbb1ae1669": "granite-embed-multi-311m",  # ibm-granite/granite-embedding-311m-multilingual-r2
    "9dcf830ee9990cdbf78cc523a5f7bd9ad8f3f9890c2d3581d2785ad10f07049d": "mellum2",  # JetBrains/Mellum2-12B-A2.5B-Base
    "972da7b59cec44d1f0a490a86c96df53859e486e481563e5dddac155013d87ac": "laguna",  # poolside/Laguna-XS.2
    "653660222fb704f61cbf2b618a8ae6502b7f8b20c980f9a5de07ed78e13319cd": "ufakzeka",  # ufakai/ufakzeka-1
}
